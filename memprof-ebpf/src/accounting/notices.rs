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
    // Written in place: the record (40 bytes) is not built on the BPF
    // stack, which the allocation probes use up.
    let Some(mut entry) = NOTICES.reserve::<ProcessNotice>(0) else {
        count_lost(LostCause::NoticeDropped);
        return false;
    };
    // SAFETY: a reserved record of the right size; the helpers read the
    // clock and the current task's name.
    unsafe {
        let notice = &mut *entry.as_mut_ptr();
        notice.kind = kind as u32;
        notice.tgid = tgid;
        notice.generation = generation;
        notice.parent = parent;
        notice.time_ns = aya_ebpf::helpers::generated::bpf_ktime_get_ns();
        if aya_ebpf::helpers::generated::bpf_get_current_comm(
            notice.comm.as_mut_ptr().cast(),
            notice.comm.len() as u32,
        ) != 0
        {
            notice.comm = [0; 16];
        }
    }
    // Wake the reader now, not when the buffer fills: the process may
    // exit within a millisecond, and its memory map must be read first.
    entry.submit(BPF_RB_FORCE_WAKEUP as u64);
    true
}
