//! Direct mappings: the C library's `mmap`, `mremap`, `munmap` and `sbrk`.
use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

use crate::accounting::mappings;

/// Entry of a mapping function: `accounting::mappings::entered`.
#[uprobe]
pub fn mapping_enter(ctx: ProbeContext) -> u32 {
    mappings::entered(ctx)
}

/// Return of a mapping function: `accounting::mappings::returned`.
#[uretprobe]
pub fn mapping_return(ctx: RetProbeContext) -> u32 {
    mappings::returned(ctx)
}
