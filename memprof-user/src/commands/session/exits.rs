//! How a session ends: the targets' exits watched through pidfds, the
//! traced command's exit status, and no process held from then on.
use std::time::Duration;

use anyhow::{Context as _, Result};
use aya::Ebpf;
use nix::{
    sys::{
        signal::kill,
        wait::{waitpid, WaitPidFlag, WaitStatus},
    },
    unistd::Pid,
};
use tokio::io::unix::AsyncFd;

use super::{Ending, Profiled};
use crate::host::pidfd::pidfd_open;

/// From now on the kernel stops no process to wait for memprof (see
/// `HOLD_FOR_TABLES`); a stop it decided on just before is announced in a
/// notice the notice thread still reads (it empties the ring buffer
/// before it ends).
pub(super) fn stop_holding(ebpf: &mut Ebpf) -> Result<()> {
    let mut holds_off: aya::maps::Array<&mut aya::maps::MapData, u32> =
        aya::maps::Array::try_from(ebpf.map_mut("HOLDS_OFF").context("map HOLDS_OFF")?)?;
    holds_off.set(0, 1, 0).context("map HOLDS_OFF")?;
    // A program that read the flag before it changed finishes in
    // microseconds, its notice submitted.
    std::thread::sleep(Duration::from_millis(5));
    Ok(())
}

/// The traced command's exit status, shell style (128+N for signal N).
/// On Ctrl-C / SIGTERM the command gets the signal too, if the terminal
/// did not already deliver it.
pub(super) async fn finish_command(pid: Pid, ending: &Ending) -> i32 {
    if let Ending::Signal(signal) = ending {
        if !wait_exit(pid, Duration::from_millis(100)).await {
            let _ = kill(pid, *signal);
            wait_exit(pid, Duration::from_secs(2)).await;
        }
    }
    match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => code,
        Ok(WaitStatus::Signaled(_, signal, _)) => 128 + signal as i32,
        _ => match ending {
            Ending::Signal(signal) => 128 + *signal as i32,
            _ => 0,
        },
    }
}

/// Waits up to `limit` for `pid` to exit (without reaping it).
async fn wait_exit(pid: Pid, limit: Duration) -> bool {
    let Ok(fd) = pidfd_open(pid.as_raw()) else {
        return true;
    };
    let Ok(fd) = watch(fd) else {
        return true;
    };
    tokio::time::timeout(limit, fd.readable()).await.is_ok()
}

/// Resolves when the target processes have all exited.
pub(super) fn exit_watch(
    profiled: &Profiled,
) -> Result<impl std::future::Future<Output = Result<()>>> {
    let pids: Vec<i32> = match profiled {
        Profiled::Command(pid) => vec![pid.as_raw()],
        Profiled::Pids(pids) => pids.clone(),
    };
    let fds = pids
        .iter()
        .filter_map(|&pid| pidfd_open(pid).ok())
        .map(watch)
        .collect::<std::io::Result<Vec<_>>>()?;
    Ok(async move {
        for fd in &fds {
            let _ = fd.readable().await?;
        }
        Ok(())
    })
}

/// Registers a readable fd (a ring buffer, a pidfd) with the runtime.
fn watch<T: std::os::fd::AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its fd, which stays open as long as the AsyncFd.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }
        .map_err(std::io::Error::from)
}
