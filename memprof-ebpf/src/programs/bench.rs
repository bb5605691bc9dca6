//! Empty programs: the benchmark's floor (`--empty-programs`).
use aya_ebpf::{
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};

/// Does nothing: attached instead of `site_enter` by the benchmark's
/// floor run (`--empty-programs`), to measure what the traps alone cost.
#[uprobe]
pub fn noop_enter(_ctx: ProbeContext) -> u32 {
    0
}

/// The return-probe counterpart of [`noop_enter`].
#[uretprobe]
pub fn noop_return(_ctx: RetProbeContext) -> u32 {
    0
}
