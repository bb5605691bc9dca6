//! Counts and sizes as people write them: "1,234 stacks", "4.0 MiB".
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
