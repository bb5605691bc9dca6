//! Least privilege once memprof is set up: it runs as root and parses
//! what other processes control (ELF, DWARF, /proc), so after it has
//! bound its socket, started the command and attached its probes it
//! keeps only the capabilities the rest of a profile uses, and drops the
//! others from its effective, permitted and bounding sets (for the
//! threads it starts from then on too):
//!
//! - `CAP_BPF`, `CAP_PERFMON`, `CAP_SYS_ADMIN`: the probes of libraries
//!   loaded later (perf events, tracefs, BPF maps), /proc/PID/map_files;
//! - `CAP_SYS_PTRACE`, `CAP_DAC_READ_SEARCH`, `CAP_CHECKPOINT_RESTORE`:
//!   other users' /proc/PID (maps, root, map_files) and their files;
//! - `CAP_KILL`: holding and releasing the processes it follows;
//! - `CAP_DAC_OVERRIDE`, `CAP_CHOWN`, `CAP_FOWNER`: reports written where
//!   the user who ran sudo asked, and given to that user;
//! - `CAP_SYS_RESOURCE`, `CAP_SYS_NICE`, `CAP_IPC_LOCK`: its own limits
//!   and the notice thread's priority.
//!
//! Gone: binding ports, changing users or groups, modules, raw I/O,
//! devices, the clock, chroot, audit and the rest.
use caps::{CapSet, Capability};

/// What a running profile keeps (see the module's doc).
const KEPT: [Capability; 13] = [
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_CHECKPOINT_RESTORE,
    Capability::CAP_KILL,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_CHOWN,
    Capability::CAP_FOWNER,
    Capability::CAP_SYS_RESOURCE,
    Capability::CAP_SYS_NICE,
    Capability::CAP_IPC_LOCK,
];

/// Drops every capability but [`KEPT`] from the calling thread (memprof's
/// main thread, before it starts the others). A failure leaves memprof as
/// it was, said once: a profile is not refused for it.
pub fn drop_unneeded() {
    if let Err(err) = try_drop() {
        eprintln!("memprof: warning: capabilities not dropped: {err}");
    }
}

fn try_drop() -> Result<(), caps::errors::CapsError> {
    let kept: caps::CapsHashSet = KEPT.into_iter().collect();
    for capability in caps::all() {
        if !kept.contains(&capability) && caps::has_cap(None, CapSet::Bounding, capability)? {
            caps::drop(None, CapSet::Bounding, capability)?;
        }
    }
    let permitted = caps::read(None, CapSet::Permitted)?;
    let keep: caps::CapsHashSet = permitted.intersection(&kept).copied().collect();
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    // Nothing to hand on to a program memprof would run (it runs none
    // from now on).
    caps::clear(None, CapSet::Inheritable)?;
    caps::clear(None, CapSet::Ambient)?;
    Ok(())
}
