//! An allocator site's BPF cookie: which function it is and where its
//! arguments are.
use crate::allocators::{self, ALLOCATORS};

/// What one probe passes to the shared BPF program, packed in its BPF
/// cookie so that the program needs no table lookup: the allocator's row
/// index and where its size and pointer arguments are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeCookie {
    pub allocator: u8,
    pub size_arg: u8,
    pub count_arg: u8,
    pub may_nest: bool,
    /// Argument holding a block the call may free or move, or NO_ARG.
    pub old_pointer_arg: u8,
    /// Argument pointing where the call stores the new block, or NO_ARG.
    pub out_pointer_arg: u8,
    /// A Go function: its arguments are in Go's registers (RAX, RBX,
    /// RCX, RDI, RSI, R8), not C's.
    pub go_abi: bool,
    /// Probed at a Go prologue's `jbe` to `morestack`: a call whose flags
    /// take it (CF or ZF set) grows its stack and enters again, counted
    /// then.
    pub go_stack_check: bool,
}

/// The argument registers of a probed call (x86-64: rdi, rsi, rdx, rcx,
/// r8, r9; a Go function's: rax, rbx, rcx, rdi, rsi, r8).
pub type Args = [u64; 6];

impl ProbeCookie {
    /// The cookie of the probe for row `index` of [`ALLOCATORS`].
    pub const fn of_allocator(index: usize) -> ProbeCookie {
        let spec = &ALLOCATORS[index];
        ProbeCookie {
            allocator: index as u8,
            size_arg: spec.size_arg,
            count_arg: spec.count_arg,
            may_nest: spec.may_nest,
            old_pointer_arg: spec.old_pointer_arg,
            out_pointer_arg: spec.out_pointer_arg,
            go_abi: false,
            go_stack_check: false,
        }
    }

    #[inline(always)]
    pub const fn encode(self) -> u64 {
        (self.allocator as u64)
            | (self.size_arg as u64) << 8
            | (self.count_arg as u64) << 16
            | (self.may_nest as u64) << 24
            | (self.go_abi as u64) << 25
            | (self.go_stack_check as u64) << 26
            | (self.old_pointer_arg as u64) << 32
            | (self.out_pointer_arg as u64) << 40
    }

    #[inline(always)]
    pub const fn decode(cookie: u64) -> Self {
        ProbeCookie {
            allocator: cookie as u8,
            size_arg: (cookie >> 8) as u8,
            count_arg: (cookie >> 16) as u8,
            may_nest: (cookie >> 24) & 1 == 1,
            go_abi: (cookie >> 25) & 1 == 1,
            go_stack_check: (cookie >> 26) & 1 == 1,
            old_pointer_arg: (cookie >> 32) as u8,
            out_pointer_arg: (cookie >> 40) as u8,
        }
    }

    /// The value of argument `index` (NO_ARG gives 0).
    #[inline(always)]
    pub fn pointer_arg(args: Args, index: u8) -> u64 {
        if index == allocators::NO_ARG {
            0
        } else {
            arg_value(args, index)
        }
    }

    /// Bytes requested by a call, from its first three arguments: the
    /// size, times the element count when there is one. Saturates instead
    /// of wrapping, as the allocator itself fails such a request.
    #[inline(always)]
    pub fn requested_bytes(self, args: Args) -> u64 {
        let size = arg_value(args, self.size_arg);
        if self.count_arg == allocators::NO_ARG {
            size
        } else {
            saturating_mul(size, arg_value(args, self.count_arg))
        }
    }
}

/// `a * b`, saturating. Written out in 32-bit halves because BPF has no
/// 128-bit multiply, which LLVM uses for any overflow check it recognises.
#[inline(always)]
pub fn saturating_mul(a: u64, b: u64) -> u64 {
    let (big, small) = if a >= b { (a, b) } else { (b, a) };
    if small >> 32 != 0 {
        return u64::MAX;
    }
    let high = (big >> 32) * small;
    if high >> 32 != 0 {
        return u64::MAX;
    }
    let low = (big & 0xffff_ffff) * small;
    let product = (high << 32).wrapping_add(low);
    if product < low {
        u64::MAX
    } else {
        product
    }
}

#[inline(always)]
fn arg_value(args: Args, index: u8) -> u64 {
    match index {
        0 => args[0],
        1 => args[1],
        2 => args[2],
        3 => args[3],
        4 => args[4],
        _ => args[5],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_round_trips_every_allocator() {
        for index in 0..ALLOCATORS.len() {
            let cookie = ProbeCookie::of_allocator(index);
            assert_eq!(ProbeCookie::decode(cookie.encode()), cookie);
        }
    }

    #[test]
    fn requested_bytes_follow_the_table() {
        let calloc = ProbeCookie::of_allocator(1);
        assert_eq!(calloc.requested_bytes([3, 40, 0, 0, 0, 0]), 120);
        let reallocarray = ProbeCookie::of_allocator(3);
        assert_eq!(reallocarray.requested_bytes([0, 6, 50, 0, 0, 0]), 300);
        let posix_memalign = ProbeCookie::of_allocator(4);
        assert_eq!(
            posix_memalign.requested_bytes([0x1000, 64, 1000, 0, 0, 0]),
            1000
        );
    }

    #[test]
    fn multiplication_saturates() {
        assert_eq!(saturating_mul(u64::MAX, 2), u64::MAX);
        assert_eq!(saturating_mul(1 << 32, 1 << 32), u64::MAX);
        assert_eq!(saturating_mul((1 << 40) + 7, 3), ((1 << 40) + 7) * 3);
        assert_eq!(saturating_mul(0, u64::MAX), 0);
        assert_eq!(saturating_mul(u64::MAX / 3, 3), u64::MAX / 3 * 3);
    }
}
