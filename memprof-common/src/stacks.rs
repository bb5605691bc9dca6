//! Stacks as the kernel stores them: return addresses beyond the caller,
//! and the flags a call site's key carries about its stack.
/// Frames kept per stack beyond the direct caller (a power of two). 64
/// cut 45% of the calls of a Python program importing a few stdlib
/// modules (each import nests ~20 frames of the interpreter); peers keep
/// 127 (the kernel's `perf_event_max_stack`).
pub const MAX_FRAMES: usize = 128;

/// A user stack as the BPF frame-pointer walk found it: return addresses,
/// innermost first; unused slots are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackFrames {
    pub len: u64,
    pub ips: [u64; MAX_FRAMES],
}

/// `AllocKey::reserved` bit: the stack walk (either `--unwind`) stopped
/// before the outermost frame for a reason counted as lost (`unwind_*`):
/// the stack is partial.
pub const STACK_CUT: u32 = 1;

/// `AllocKey::reserved` bit of a mapping notice: the call was made where
/// nothing is recorded (`--while`, paused); it still ends what it replaces
/// (MAP_FIXED), and is not counted.
pub const NOT_RECORDED: u32 = 2;
