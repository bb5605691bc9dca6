//! Process events: exec, fork and exit.
use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

use crate::accounting::process;

/// A process replaced its image: `accounting::process::exec`.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn on_exec(ctx: RawTracePointContext) -> u32 {
    process::exec(ctx)
}

/// A process forked: `accounting::process::fork`.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn on_fork(ctx: RawTracePointContext) -> u32 {
    process::fork(ctx)
}

/// A thread exited: `accounting::process::exit`.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn on_exit(_ctx: RawTracePointContext) -> u32 {
    process::exit(_ctx)
}
