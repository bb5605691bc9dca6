//! What user space set before load that several modules read: whether
//! blocks are tracked (`--live`), and memprof's own process.
use aya_ebpf::helpers::bpf_get_current_pid_tgid;

/// `--live`, set by user space before load: pair allocations with their
/// pointers and frees.
#[unsafe(no_mangle)]
static LIVE_MODE: u8 = 0;

#[inline(always)]
pub fn live_mode() -> bool {
    // SAFETY: a read-only global; volatile so the compiler keeps the read.
    unsafe { core::ptr::read_volatile(&LIVE_MODE) != 0 }
}

/// memprof's own process, set by user space before load when its probes
/// cover every process (`monitor` of the whole host): never profiled.
#[unsafe(no_mangle)]
static IGNORED_TGID: u32 = 0;

#[inline(always)]
pub(crate) fn ignored() -> bool {
    // SAFETY: a read-only global; volatile so the loader's value is used.
    let ignored = unsafe { core::ptr::read_volatile(&IGNORED_TGID) };
    ignored != 0 && (bpf_get_current_pid_tgid() >> 32) as u32 == ignored
}
