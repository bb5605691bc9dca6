//! `--while FUNCTION`: the function's entry and return.
use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

use crate::accounting::regions;

/// Entry of a `--while` function: `accounting::regions::entered`.
#[uprobe]
pub fn region_enter(ctx: ProbeContext) -> u32 {
    regions::entered(ctx)
}

/// Return of a `--while` function: `accounting::regions::returned`.
#[uretprobe]
pub fn region_return(_ctx: RetProbeContext) -> u32 {
    regions::returned(_ctx)
}
