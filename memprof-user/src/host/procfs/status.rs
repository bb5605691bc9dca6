//! Whether a process runs, is stopped or has ended, its parent, children,
//! start time and CPU time, from /proc.
use std::{collections::HashMap, fs, path::PathBuf};

/// The CPU time process `pid` has taken, all its threads, in ns (its
/// process CPU clock), while it runs.
pub fn cpu_time_ns(pid: u32) -> Option<u64> {
    let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(pid as i32)).ok()?;
    let time = nix::time::clock_gettime(clock).ok()?;
    Some(time.tv_sec() as u64 * 1_000_000_000 + time.tv_nsec() as u64)
}

/// The parent of process `pid` (/proc/PID/stat field 4), while it runs.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_fields_after_name(&stat).nth(1)?.parse().ok()
}

/// Whether process `pid` is stopped by a stop signal it sent itself:
/// stopped (/proc/PID/stat state T) on its way out of kill, tkill or
/// tgkill with a stop signal (/proc/PID/syscall: x86-64 numbers). Not a
/// process memprof stopped (that one is in no such call).
pub fn stopped_itself(pid: u32) -> bool {
    is_stopped(pid)
        && fs::read_to_string(format!("/proc/{pid}/syscall"))
            .is_ok_and(|call| sends_itself_a_stop(&call))
}

/// Whether process `pid` is stopped by a signal (state T; not t, a
/// debugger's stop).
pub fn is_stopped(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat_fields_after_name(&stat).next() == Some("T"))
}

/// A /proc/PID/syscall line of a kill, tkill or tgkill sending a stop
/// signal (SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU).
fn sends_itself_a_stop(call: &str) -> bool {
    let words: Vec<u64> = call
        .split_whitespace()
        .map_while(|word| match word.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => word.parse().ok(),
        })
        .collect();
    let signal = match words.first() {
        Some(62 | 200) => words.get(2),
        Some(234) => words.get(3),
        _ => None,
    };
    signal.is_some_and(|&signal| (19..=22).contains(&signal))
}

/// Whether a child of process `pid` is stopped by a signal (state T).
pub fn has_stopped_child(pid: u32) -> bool {
    children()
        .get(&pid)
        .is_some_and(|children| children.iter().any(|&child| is_stopped(child)))
}

/// Each running process's children, from every process's parent (the
/// kernel here keeps no list of children: CONFIG_PROC_CHILDREN is off).
pub fn children() -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some(parent) = parent_of(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    children
}

/// The processes descended from `root` in `children`, but those under a
/// process `stop` says to leave out (and that process itself).
pub fn descendants(
    children: &HashMap<u32, Vec<u32>>,
    root: u32,
    stop: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if child != root && !stop(child) && !found.contains(&child) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// When process `pid` started (clock ticks since boot, /proc/PID/stat
/// field 22): with the pid, who it is. None once it is gone (a zombie
/// included; not one whose main thread alone has ended, pthread_exit,
/// while others run on).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    if has_ended(pid, &stat) {
        return None;
    }
    // Fields 4 to 21 come between the state (3) and the start time (22).
    stat_fields_after_name(&stat).nth(19)?.parse().ok()
}

/// Whether process `pid`, whose /proc/PID/stat reads `stat`, has ended:
/// its main thread is a zombie and no other thread runs on (after the
/// main thread's pthread_exit the others may).
pub fn has_ended(pid: u32, stat: &str) -> bool {
    thread_ended(stat) && !process_runs(pid)
}

/// Whether the thread whose /proc stat reads `stat` has ended: a zombie,
/// or dead.
fn thread_ended(stat: &str) -> bool {
    matches!(stat_fields_after_name(stat).next(), Some("Z" | "X"))
}

/// Whether process `pid` started after `instant` (to the clock tick).
pub fn started_after(pid: u32, instant: std::time::Instant) -> bool {
    let Some(ticks) = start_time(pid) else {
        return false;
    };
    let Ok(Some(per_sec)) = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) else {
        return false;
    };
    let Ok(boot) = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME) else {
        return false;
    };
    let uptime = std::time::Duration::from(boot);
    let age = uptime.saturating_sub(std::time::Duration::from_secs_f64(
        ticks as f64 / per_sec as f64,
    ));
    std::time::Instant::now()
        .checked_sub(age)
        .is_some_and(|started| started > instant)
}

/// True while any thread of process `tgid` still runs: its main thread
/// may have ended (pthread_exit) while others go on.
pub fn process_runs(tgid: u32) -> bool {
    live_thread(tgid).is_some()
}

/// A thread of process `tgid` that has not ended, if any.
pub fn live_thread(tgid: u32) -> Option<u32> {
    let threads = fs::read_dir(format!("/proc/{tgid}/task")).ok()?;
    threads.flatten().find_map(|thread| running_thread(&thread))
}

/// Every thread of process `tgid` that has not ended.
pub fn live_threads(tgid: u32) -> Vec<u32> {
    let Ok(threads) = fs::read_dir(format!("/proc/{tgid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .filter_map(|thread| running_thread(&thread))
        .collect()
}

/// The thread id of /proc/PID/task entry `thread`, unless it has ended.
fn running_thread(thread: &fs::DirEntry) -> Option<u32> {
    let stat = fs::read_to_string(thread.path().join("stat")).ok()?;
    if thread_ended(&stat) {
        return None;
    }
    thread.file_name().to_str()?.parse().ok()
}

/// Whether process `pid`'s main thread has ended (a zombie, or dead),
/// whether or not other threads run on.
pub fn main_thread_ended(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| thread_ended(&stat))
}

/// The /proc directory to read process `pid`'s links and files through
/// (exe, root, cgroup): /proc/PID, or once its main thread has ended
/// (pthread_exit) while others run on, a live thread's
/// /proc/PID/task/TID: /proc/PID answers through the main thread then,
/// its exe and root gone, its cgroup the hierarchies' roots.
pub fn live_dir(pid: u32) -> PathBuf {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    match main_thread_ended(pid).then(|| live_thread(pid)).flatten() {
        Some(tid) => dir.join(format!("task/{tid}")),
        None => dir,
    }
}

/// Whether the address space /proc shows through `dir` (/proc/PID or one
/// of its tasks) is still being built by an exec: the kernel names the
/// new program (comm, exe, maps) before it lays out the arguments, and
/// until then the mm's `arg_start` (stat field 48) is 0. A process that
/// ran with an empty argv still has one. Where the reader may not see the
/// mm's layout (another user namespace's process, say), the kernel shows
/// `start_code` (field 26) as 1 and the rest as 0: not an exec. Not
/// readable: false.
pub fn exec_under_way(dir: &std::path::Path) -> bool {
    let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
        return false;
    };
    // Field 3 (the state) is the first after the name.
    let field = |n: usize| stat_fields_after_name(&stat).nth(n - 3);
    field(48) == Some("0") && field(26) != Some("1")
}

/// The fields of a /proc/PID/stat line after the command name (field 2),
/// which is in parentheses and may hold spaces: the state comes first.
pub fn stat_fields_after_name(stat: &str) -> std::str::SplitWhitespace<'_> {
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_has_its_arguments_laid_out() {
        let me = std::path::PathBuf::from(format!("/proc/{}", std::process::id()));
        let stat = std::fs::read_to_string(me.join("stat")).unwrap();
        let arg_start = stat_fields_after_name(&stat).nth(48 - 3).unwrap();
        assert_ne!(arg_start, "0", "{stat}");
        assert!(!exec_under_way(&me));
        // A stat line whose layout is hidden from the reader.
        let dir = std::env::temp_dir().join(format!("memprof-stat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let hidden: Vec<String> = (3..=52)
            .map(|n| match n {
                26 | 27 => "1".to_string(),
                _ => "0".to_string(),
            })
            .collect();
        std::fs::write(dir.join("stat"), format!("1 (init) {}", hidden.join(" "))).unwrap();
        assert!(!exec_under_way(&dir));
        let building: Vec<&str> = (3..=52).map(|_| "0").collect();
        std::fs::write(dir.join("stat"), format!("9 (a b) {}", building.join(" "))).unwrap();
        assert!(exec_under_way(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stopped_child_is_found_and_its_cpu_time_moves_only_when_it_runs() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let (pid, me) = (child.id(), std::process::id());
        // SAFETY: sends a signal to the test's own child, nothing else.
        let signal = |signal| unsafe { libc::kill(pid as i32, signal) };
        let settle = || std::thread::sleep(std::time::Duration::from_millis(50));
        settle();
        assert!(!has_stopped_child(me));
        signal(libc::SIGSTOP);
        settle();
        assert!(has_stopped_child(me));
        let stopped_at = cpu_time_ns(pid).unwrap();
        settle();
        assert_eq!(cpu_time_ns(pid), Some(stopped_at));
        signal(libc::SIGCONT);
        settle();
        assert!(!has_stopped_child(me));
        assert!(cpu_time_ns(pid).unwrap() > stopped_at);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_stop_a_process_sent_itself_is_told_from_other_calls() {
        // su: kill(getpid(), SIGSTOP); raise(SIGTSTP) is a tgkill.
        assert!(sends_itself_a_stop(
            "62 0x40ce 0x13 0x7fff0405ec18 0x0 0x0 0x0 0x7ff 0x7fe"
        ));
        assert!(sends_itself_a_stop(
            "234 0x40ce 0x40ce 0x14 0x0 0x0 0x0 0x7ff 0x7fe"
        ));
        // A SIGTERM, a sleep, memprof's stop at a uprobe (no call).
        assert!(!sends_itself_a_stop(
            "62 0x40ce 0xf 0x7fff0405ec18 0x0 0x0 0x0 0x7ff 0x7fe"
        ));
        assert!(!sends_itself_a_stop(
            "230 0x0 0x0 0x7ffdb9e2f3d0 0x7ffd 0x0 0x0 0x7ff 0x7f9"
        ));
        assert!(!sends_itself_a_stop("-1 0x7ffdb9e2f3b8 0x7f9d424ff503"));
        assert!(!sends_itself_a_stop("running"));
    }
}
