//! Libraries loaded: the dynamic loader's `_dl_debug_state`.
use aya_ebpf::{macros::uprobe, programs::ProbeContext};

use crate::accounting::loader;

/// The loader changed its list of objects: `accounting::loader::walk`.
#[uprobe]
pub fn on_libraries(ctx: ProbeContext) -> u32 {
    loader::walk(ctx)
}
