//! Process notices to user space, on the `NOTICES` ring buffer.
use aya_ebpf::bindings::BPF_RB_FORCE_WAKEUP;
use memprof_common::{
    lost::LostCause,
    notices::{NoticeKind, ProcessNotice},
};

use crate::kernel::maps::{count_lost, NOTICES};

#[inline(always)]
/// Sends a notice; false when the ring buffer had no room (counted).
pub fn notify(kind: NoticeKind, tgid: u32, generation: u32, parent: u32) -> bool {
    let notice = ProcessNotice {
        kind: kind as u32,
        tgid,
        generation,
        parent,
        // SAFETY: reads the clock.
        time_ns: unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_ns() },
    };
    // Wake the reader now, not when the buffer fills: the process may
    // exit within a millisecond, and its memory map must be read first.
    let sent = NOTICES
        .output::<ProcessNotice>(&notice, BPF_RB_FORCE_WAKEUP as u64)
        .is_ok();
    if !sent {
        count_lost(LostCause::NoticeDropped);
    }
    sent
}
