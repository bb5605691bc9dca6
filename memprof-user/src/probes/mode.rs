//! Which kind of profile memprof runs: what it starts, whom it watches,
//! whether the budget takes probes in and out.
use memprof_common::settings::{Gating, WatchExecs};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `trace`: the command memprof starts, held until its probes are in;
    /// a static program has no loader to announce its code.
    Trace { static_program: bool },
    /// `attach`: running processes, until they end.
    Attach,
    /// `monitor --pid/--comm/--exe/--cgroup`: those processes, and
    /// (`watches_later`) those that start later and match.
    MonitorByName { watches_later: bool, budget: bool },
    /// `monitor` with nothing named: every process on the host.
    MonitorWholeHost { budget: bool },
}

impl Mode {
    /// memprof starts the processes (`trace`), so they may wait while
    /// their new code's unwind tables and probes go in.
    pub fn starts_processes(self) -> bool {
        matches!(self, Mode::Trace { .. })
    }

    pub fn is_monitor(self) -> bool {
        matches!(
            self,
            Mode::MonitorByName { .. } | Mode::MonitorWholeHost { .. }
        )
    }

    pub fn whole_host(self) -> bool {
        matches!(self, Mode::MonitorWholeHost { .. })
    }

    /// Processes that start later are taken in (the whole host, or a
    /// `monitor` selection by name, executable or cgroup).
    pub fn watches_later(self) -> bool {
        match self {
            Mode::MonitorByName { watches_later, .. } => watches_later,
            Mode::MonitorWholeHost { .. } => true,
            Mode::Trace { .. } | Mode::Attach => false,
        }
    }

    /// `monitor`'s budget takes processes' probes in and out.
    pub fn budget(self) -> bool {
        match self {
            Mode::MonitorByName { budget, .. } | Mode::MonitorWholeHost { budget } => budget,
            Mode::Trace { .. } | Mode::Attach => false,
        }
    }

    /// `GATING`: whose probes the budget takes in and out together.
    pub fn gating(self) -> Gating {
        match self {
            Mode::MonitorWholeHost { budget: true } => Gating::Host,
            Mode::MonitorByName { budget: true, .. } => Gating::Processes,
            _ => Gating::Off,
        }
    }

    /// `WATCH_EXECS`: which execs the kernel announces.
    pub fn watch_execs(self) -> WatchExecs {
        match self {
            Mode::MonitorWholeHost { .. } => WatchExecs::Every,
            Mode::MonitorByName {
                watches_later: true,
                ..
            } => WatchExecs::Unwatched,
            _ => WatchExecs::Off,
        }
    }
}
