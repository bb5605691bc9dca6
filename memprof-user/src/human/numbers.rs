//! Counts and sizes as people write them: "1,234 stacks", "4.0 MiB",
//! "512K".
use std::str::FromStr;

/// "4.0 MiB": binary units, as allocators count.
pub fn human_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    bytesize::ByteSize::b(bytes).display().iec().to_string()
}

/// "1 stack", "1,234 stacks".
pub fn how_many(n: u64, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// "1,234,567".
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count given as `4096`, `64K`, `64KiB`, `1.5M`... K, M, G and T
/// are powers of 1024 everywhere, with or without `B`/`iB` (`512K` and
/// `512KiB` and `512KB` are all 524,288 bytes), as allocators and
/// `ls -h` count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteCount(pub u64);

impl FromStr for ByteCount {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("'{s}' is not a byte count (try 4096, 64K or 1MiB)");
        let text = s.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, unit) = text.split_at(split);
        let shift = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kb" | "kib" => 10,
            "m" | "mb" | "mib" => 20,
            "g" | "gb" | "gib" => 30,
            "t" | "tb" | "tib" => 40,
            _ => return Err(invalid()),
        };
        if let Ok(whole) = number.parse::<u64>() {
            return whole
                .checked_mul(1 << shift)
                .map(ByteCount)
                .ok_or_else(invalid);
        }
        let value: f64 = number.parse().map_err(|_| invalid())?;
        let bytes = value * (1u64 << shift) as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 || bytes.fract() != 0.0 {
            return Err(invalid());
        }
        Ok(ByteCount(bytes as u64))
    }
}

/// A count that must be at least 1 (a table size, a depth).
pub fn at_least_one<T: FromStr + PartialOrd + From<u8>>(s: &str) -> Result<T, String> {
    match s.parse::<T>() {
        Ok(n) if n >= T::from(1u8) => Ok(n),
        Ok(_) => Err("must be at least 1".to_string()),
        Err(_) => Err(format!("'{s}' is not a whole number")),
    }
}

/// A count of at least 1 that fits a u32, whole or with K, M or G
/// (powers of 1024, as the byte sizes: `4M` rows are 4,194,304).
pub fn count_at_least_one(s: &str) -> Result<u32, String> {
    let trimmed = s.trim();
    let (number, shift) = match trimmed.char_indices().last() {
        Some((at, 'k' | 'K')) => (&trimmed[..at], 10),
        Some((at, 'm' | 'M')) => (&trimmed[..at], 20),
        Some((at, 'g' | 'G')) => (&trimmed[..at], 30),
        _ => (trimmed, 0),
    };
    let whole = number
        .parse::<u64>()
        .map_err(|_| format!("'{s}' is not a whole number (or one with K, M, G)"))?;
    match whole.checked_shl(shift).filter(|&n| n >> shift == whole) {
        Some(0) => Err("must be at least 1".to_string()),
        Some(n) => u32::try_from(n).map_err(|_| format!("'{s}' is more than {}", u32::MAX)),
        None => Err(format!("'{s}' is more than {}", u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_k_m_and_g() {
        assert_eq!(count_at_least_one("4M"), Ok(4 << 20));
        assert_eq!(count_at_least_one("64k"), Ok(64 << 10));
        assert_eq!(count_at_least_one("1000"), Ok(1000));
        assert_eq!(count_at_least_one("0"), Err("must be at least 1".into()));
        assert!(count_at_least_one("4G").is_err());
        assert!(count_at_least_one("1.5M").is_err());
        assert!(count_at_least_one("M").is_err());
    }

    #[test]
    fn byte_units_are_powers_of_1024() {
        for (text, bytes) in [
            ("4096", 4096),
            ("512K", 512 << 10),
            ("512k", 512 << 10),
            ("512KiB", 512 << 10),
            ("512KB", 512 << 10),
            ("64 KiB", 64 << 10),
            ("1M", 1 << 20),
            ("1.5M", 3 << 19),
            ("2G", 2 << 30),
            ("10B", 10),
        ] {
            assert_eq!(text.parse::<ByteCount>(), Ok(ByteCount(bytes)), "{text}");
        }
        for bad in ["lots", "", "K", "1.3B", "99999999999T", "1.5Q"] {
            assert!(bad.parse::<ByteCount>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_one_in_the_singular() {
        assert_eq!(how_many(1, "stack", "stacks"), "1 stack");
        assert_eq!(how_many(0, "stack", "stacks"), "0 stacks");
        assert_eq!(how_many(1_000, "call", "calls"), "1,000 calls");
    }

    #[test]
    fn formats_numbers() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(4 * 1024 * 1024), "4.0 MiB");
    }

    #[test]
    fn counts_start_at_one() {
        assert_eq!(at_least_one::<u32>("3"), Ok(3));
        assert!(at_least_one::<u32>("0").is_err());
        assert!(at_least_one::<usize>("x").is_err());
    }
}
