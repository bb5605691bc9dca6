//! Poisson sampling by bytes (`--sample-bytes N`), in integer arithmetic
//! the BPF programs can run (no floating point there).
//!
//! Every allocated byte is a sample point with probability 1/N: a
//! countdown drawn from an exponential distribution with mean N is
//! decremented by each allocation's size, and the allocation that takes it
//! to zero is sampled (the method of tcmalloc, jemalloc and heapprofd).
//! An allocation of `s` bytes is then sampled with probability
//! p(s) = 1 - exp(-s/N), whatever came before it, so weighing each sample
//! by 1/p(s) (count) and s/p(s) (bytes) gives unbiased estimates.

use crate::{cookies::saturating_mul, sites::Weight};

/// A weighed count of one call: counts are kept in these units when
/// sampling, so that fractional weights add up exactly.
pub const UNIT: u64 = 1 << 16;

/// Fixed point with 32 fractional bits.
const ONE_Q32: u64 = 1 << 32;

/// exp(-x) for x in Q32 with x < 32, in Q32. Halves x until it is below
/// 1/2, sums the series to the 6th power, then squares back up.
///
/// Written without data-dependent branches: the BPF verifier walks every
/// path of a program, and sixteen little `if`s multiply its paths.
#[inline(always)]
pub fn exp_neg_q32(x: u64) -> u64 {
    let mut y = x;
    let mut halvings = 0;
    for _ in 0..6 {
        // 1 when y >= 1/2 (y < 32, so y >> 31 < 64).
        let halve = ((y >> 31) + 63) >> 6;
        y >>= halve;
        halvings += halve;
    }
    let y2 = (y * y) >> 32;
    let y3 = (y2 * y) >> 32;
    let y4 = (y3 * y) >> 32;
    let y5 = (y4 * y) >> 32;
    let y6 = (y5 * y) >> 32;
    let mut e = ONE_Q32 - y + y2 / 2 - y3 / 6 + y4 / 24 - y5 / 120 + y6 / 720;
    for round in 0..6 {
        // 1 while round < halvings (halvings - round is in -5..=6).
        let square = (halvings + 63 - round) >> 6;
        let squared = e.wrapping_mul(e) >> 32;
        let mask = 0u64.wrapping_sub(square);
        e = (squared & mask) | (e & !mask);
    }
    e
}

/// The weight of a sampled allocation of `size` bytes at mean interval
/// `mean` bytes: 1/p(size) in Q16 (at least 1.0 = 65536).
#[inline(always)]
pub fn weight_q16(size: u64, mean: u64) -> u64 {
    if mean == 0 || size >= mean.saturating_mul(32) {
        return 1 << 16;
    }
    // x = size/mean in Q32, without overflowing the shift.
    let x = if size < 1 << 31 {
        (size << 32) / mean
    } else {
        ((size << 16) / mean) << 16
    };
    let p = ONE_Q32 - exp_neg_q32(x);
    if p == 0 {
        // size 0: never sampled by bytes, but weigh it as one call.
        return 1 << 16;
    }
    ((1u64 << 48) / p).max(1 << 16)
}

/// Whether a call of `bytes` holds no sample point: then the countdown
/// `left` (bytes to the next point; 0: not drawn yet) goes down by its
/// bytes. A call that holds one is left for [`sampled`]. A call of 0
/// bytes is sampled as if of 1 (it stands for calls, not bytes): never
/// sampled, its calls were missing from the estimates.
#[inline(always)]
pub fn skipped(left: &mut u64, bytes: u64, mean: u64, random: impl FnOnce() -> u32) -> bool {
    let bytes = bytes.max(1);
    if *left == 0 {
        *left = next_countdown(random(), mean);
    }
    if bytes < *left {
        *left -= bytes;
        return true;
    }
    false
}

/// A call of `bytes` that holds a sample point: what it stands for. The
/// next gap starts afresh at the next call (exponential gaps are
/// memoryless).
#[inline(always)]
pub fn sampled(left: &mut u64, bytes: u64, mean: u64, mut random: impl FnMut() -> u32) -> Weight {
    *left = next_countdown(random(), mean);
    let unit = weight_q16(bytes.max(1), mean);
    Weight {
        bytes: weighed_bytes(bytes, unit, random()),
        unit,
    }
}

/// `bytes` times `unit` (Q16), rounded up with a chance equal to the
/// fraction, down otherwise: unbiased. Truncating lost up to a byte per
/// sample, a large part of a small call's weighed bytes at a small mean
/// (1.6% of 8-byte calls at 16 bytes, 37% of 1-byte calls at 1 byte).
#[inline(always)]
pub fn weighed_bytes(bytes: u64, unit: u64, random: u32) -> u64 {
    saturating_mul(bytes, unit).saturating_add(u64::from(random & 0xffff)) >> 16
}

/// Bytes until the next sample: an exponential draw with mean `mean`,
/// from a uniform 32-bit random number, rounded up (at least 1). A call of
/// `s` bytes then meets the next sample point with probability exactly
/// 1 - exp(-s/mean), as the weights assume; rounded down, a call just
/// after a sample was sampled as if a byte longer (5% too many 8-byte
/// calls estimated at a 16-byte mean).
#[inline(always)]
pub fn next_countdown(random: u32, mean: u64) -> u64 {
    // -ln(U) with U = (random + 1) / 2^32 is ln(2) * (32 - log2(random + 1)).
    let log2 = log2_q16(random as u64 + 1);
    let minus_log2_u = (32u64 << 16) - log2;
    // ln(2) in Q16.
    const LN2_Q16: u64 = 45426;
    // The draw over ln(2), in Q16 (below 2^61), then times ln(2) in two
    // halves (no 128-bit product in BPF).
    let over_ln2 = mean.min(1 << 40) * minus_log2_u;
    let draw_q16 = (over_ln2 >> 16) * LN2_Q16 + (((over_ln2 & 0xffff) * LN2_Q16) >> 16);
    ((draw_q16 + 0xffff) >> 16).max(1)
}

/// log2(v) in Q16 for 1 <= v <= 2^32: the integer part by a binary
/// search, 16 fractional bits by repeated squaring; branch-free, as
/// `exp_neg_q32`.
#[inline(always)]
pub fn log2_q16(v: u64) -> u64 {
    // 1 when v >= 2^32 (v <= 2^32).
    let top = v >> 32;
    let mut value = v >> (top << 5);
    let mut integer = top << 5;
    for shift in [16u64, 8, 4, 2, 1] {
        // 1 when value >= 2^shift (value < 2^(2 shift) here).
        let above = ((value >> shift) + (1 << shift) - 1) >> shift;
        value >>= shift * above;
        integer += shift * above;
    }
    // Mantissa in [1, 2) as Q31: v scaled so its top bit is bit 31.
    let mut mantissa = (v << 31) >> integer;
    let mut fraction = 0u64;
    for bit in 0..16 {
        mantissa = (mantissa * mantissa) >> 31;
        // 1 when the square reached 2 (it is below 4).
        let carry = mantissa >> 32;
        mantissa >>= carry;
        fraction |= carry << (15 - bit);
    }
    (integer << 16) | fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_floating_point() {
        for x in [
            0.0, 1e-6, 0.001, 0.1, 0.49, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 31.9,
        ] {
            let got = exp_neg_q32((x * ONE_Q32 as f64) as u64) as f64 / ONE_Q32 as f64;
            let want = (-x).exp();
            assert!(
                (got - want).abs() < 2e-6 + want * 1e-4,
                "exp(-{x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn weights_match_floating_point() {
        for (size, mean) in [
            (1u64, 524288u64),
            (64, 4096),
            (512, 4096),
            (4096, 4096),
            (8192, 4096),
            (100_000, 4096),
            (1 << 40, 512 * 1024),
        ] {
            let got = weight_q16(size, mean) as f64 / 65536.0;
            let want = 1.0 / (1.0 - (-(size as f64) / mean as f64).exp());
            assert!(
                (got / want - 1.0).abs() < 1e-3,
                "w({size}, {mean}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn log2_is_accurate() {
        for v in [1u64, 2, 3, 1000, 65535, 1 << 31, (1 << 32) - 1, 1 << 32] {
            let got = log2_q16(v) as f64 / 65536.0;
            assert!((got - (v as f64).log2()).abs() < 1e-4, "log2({v}) = {got}");
        }
    }

    /// A fixed sequence of uniform numbers (a linear congruential generator).
    fn uniform(state: &mut u64) -> u32 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*state >> 32) as u32
    }

    /// Calls of a size near the mean (most countdowns drawn afresh, a
    /// call's weight a few bytes): the estimates still add up to the truth.
    #[test]
    fn estimates_of_calls_near_the_mean_are_unbiased() {
        for (size, mean) in [
            (0u64, 1u64),
            (0, 16),
            (1, 1),
            (2, 1),
            (8, 16),
            (16, 16),
            (24, 64),
        ] {
            let mut state = 99u64;
            let mut left = 0;
            let (mut units, mut bytes) = (0u64, 0u64);
            let calls = 2_000_000u64;
            for _ in 0..calls {
                if skipped(&mut left, size, mean, || uniform(&mut state)) {
                    continue;
                }
                let weight = sampled(&mut left, size, mean, || uniform(&mut state));
                units += weight.unit;
                bytes += weight.bytes;
            }
            let count = units as f64 / UNIT as f64;
            // Within 5 standard errors (0.3-1.4%). The biases were 1.5-37%,
            // and calls of 0 bytes were never counted.
            let p = 1.0 - (-(size.max(1) as f64) / mean as f64).exp();
            let bound = 5.0 * ((1.0 - p) / (p * calls as f64)).sqrt();
            for (what, got, want) in [
                ("calls", count, calls as f64),
                ("bytes", bytes as f64, (calls * size) as f64),
            ] {
                let error = if want == 0.0 { got } else { got / want - 1.0 };
                assert!(
                    error.abs() < bound,
                    "{size}-byte calls at mean {mean}: {what} {got}, want {want}"
                );
            }
        }
    }

    #[test]
    fn countdowns_average_the_mean() {
        let mean = 4096u64;
        let mut state = 12345u64;
        let mut sum = 0u64;
        let n = 200_000u64;
        for _ in 0..n {
            sum += next_countdown(uniform(&mut state), mean);
        }
        let average = sum as f64 / n as f64;
        assert!(
            (average / mean as f64 - 1.0).abs() < 0.01,
            "average {average}"
        );
    }
}
