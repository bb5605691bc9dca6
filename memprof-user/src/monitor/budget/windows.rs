//! When each root's probes are in: all the time, or for one window in each
//! of its spans (its duty cycle). A span is [`MIN_SPAN_PERIODS`] budget
//! periods or more, enough that the window lasts [`MIN_WINDOW`]: putting
//! probes in and taking them out costs ~2-10 ms of trapping each time,
//! uncounted. The window falls at a random time in its span, so that a
//! workload with a period of its own is not seen at one phase only, and
//! ends early when a process of it spends its allowance (`cut`): many
//! short windows over a process's life estimate it better than one long
//! one in a span it may not live to.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::{
    host::procfs::status,
    probes::{perf::Threads, Scopes},
};

/// The shortest window.
pub const MIN_WINDOW: Duration = Duration::from_millis(10);

/// The shortest span of a process with a duty cycle, in periods.
pub const MIN_SPAN_PERIODS: u32 = 3;

/// The longest span, in periods: a process whose probes would be in for
/// less than one window in this many periods stays over the budget.
pub const MAX_SPAN_PERIODS: u32 = 60;

#[derive(Default)]
pub struct Windows {
    roots: HashMap<u32, Window>,
}

struct Window {
    state: State,
    /// The traps each of its processes may take in a window of this
    /// span (its budget for the span at the calibrated cost).
    allowance: u64,
    /// Periods left in the span (1: it ends at the next period's end).
    periods_left: u32,
    span_start: Instant,
    /// How long the probes were in this span, before `state`'s time.
    in_secs: f64,
    /// Each of its processes' CPU time while the probes were in, this
    /// span (those running when they went in).
    cpu_in: HashMap<u32, u64>,
    /// When its probes last went out (None: never), and when they had
    /// gone out before that.
    last_out: Option<Instant>,
    out_before: Option<Instant>,
}

enum State {
    /// In all span; its processes' CPU times then (an allowance spent
    /// may cut it short: `cut`).
    Always {
        since: Instant,
        cpu: Vec<(u32, u64)>,
    },
    /// Out until the window opens at `start`.
    Waiting { start: Instant, end: Instant },
    /// In until `end`; the CPU time its processes had then.
    Open {
        since: Instant,
        end: Instant,
        cpu: Vec<(u32, u64)>,
    },
    /// Out for the rest of the span.
    Closed,
}

/// A span that ended: how much of it each root's probes were in.
pub struct Ended {
    pub secs: f64,
    /// The share of the span's time.
    pub share: f64,
    /// Each process's CPU time while they were in (None: in all along).
    pub cpu_in: Option<HashMap<u32, u64>>,
    /// Since when a process may have run unseen before this span's
    /// window: when the probes went out before it opened. One that
    /// started later was seen by this window or by none.
    pub unseen_since: Option<Instant>,
}

impl Windows {
    /// A period ends at `now`: the roots whose span ends with it, with
    /// their probes taken out if a window was still open.
    pub fn end_period(&mut self, now: Instant, scopes: &mut Scopes) -> HashMap<u32, Ended> {
        let mut ended = HashMap::new();
        for (&root, window) in &mut self.roots {
            window.periods_left = window.periods_left.saturating_sub(1);
            if window.periods_left > 0 {
                continue;
            }
            let always = matches!(window.state, State::Always { .. });
            match std::mem::replace(&mut window.state, State::Closed) {
                State::Always { since, cpu } => {
                    window.in_secs += now.duration_since(since).as_secs_f64();
                    window.state = State::Always { since: now, cpu };
                }
                State::Open { since, cpu, .. } => window.close(root, since, &cpu, scopes),
                State::Waiting { .. } | State::Closed => {}
            }
            let secs = now
                .duration_since(window.span_start)
                .as_secs_f64()
                .max(1e-3);
            ended.insert(
                root,
                Ended {
                    secs,
                    share: (window.in_secs / secs).min(1.0),
                    cpu_in: (!always).then(|| std::mem::take(&mut window.cpu_in)),
                    unseen_since: window.out_before.filter(|_| !always),
                },
            );
            window.in_secs = 0.0;
            window.cpu_in.clear();
        }
        ended
    }

    /// A new span for each root in `planned` (its share of the span), from
    /// `now`; roots gone from the scopes are forgotten, and new ones start
    /// with their probes in all along, as the scopes opened them. Each
    /// process may take `traps_per_sec` traps a second of its span (0:
    /// no allowance kept), all of them in its window.
    pub fn plan(
        &mut self,
        now: Instant,
        period: Duration,
        planned: &HashMap<u32, f64>,
        traps_per_sec: f64,
        scopes: &mut Scopes,
    ) {
        for (&root, &duty) in planned {
            let window = self.roots.entry(root).or_insert(Window {
                state: State::Always {
                    since: now,
                    cpu: Vec::new(),
                },
                allowance: 0,
                periods_left: 0,
                span_start: now,
                in_secs: 0.0,
                cpu_in: HashMap::new(),
                last_out: None,
                out_before: None,
            });
            window.span_start = now;
            if duty >= 1.0 {
                if !matches!(window.state, State::Always { .. }) {
                    // In for good: on every thread, as at the start (on
                    // the main thread alone, the threads running now would
                    // go out with it if it ended first).
                    scopes.put_in(root, Threads::Every, |_| {});
                }
                window.allowance = (traps_per_sec * period.as_secs_f64()) as u64;
                // Where allowances are kept (the budget enforced), an
                // allowance spent cuts this span short (`cut`): its
                // processes' CPU times now are where it began.
                let cpu = match window.allowance {
                    0 => Vec::new(),
                    allowance => {
                        scopes.allow(root, allowance);
                        cpu_times(&scopes.tree(root))
                    }
                };
                window.state = State::Always { since: now, cpu };
                window.periods_left = 1;
                continue;
            }
            if matches!(window.state, State::Always { .. }) {
                scopes.take_out(root, |_| {});
                window.went_out(now);
            }
            let periods = (MIN_WINDOW.as_secs_f64() / (duty * period.as_secs_f64()))
                .ceil()
                .clamp(MIN_SPAN_PERIODS.into(), MAX_SPAN_PERIODS.into())
                as u32;
            let span = period * periods;
            window.allowance = (traps_per_sec * span.as_secs_f64()) as u64;
            let open = span.mul_f64(duty);
            let start = now + (span - open).mul_f64(fastrand::f64());
            window.periods_left = periods;
            window.state = State::Waiting {
                start,
                end: start + open,
            };
        }
    }

    /// Roots gone from the scopes.
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.roots.retain(|&root, _| keep(root));
    }

    /// Whether `root`'s span ends at the next period's end (or it is new).
    pub fn span_ends(&self, root: u32) -> bool {
        self.roots
            .get(&root)
            .is_none_or(|window| window.periods_left == 0)
    }

    /// When the next window opens or closes.
    pub fn next_switch(&self) -> Option<Instant> {
        self.roots
            .values()
            .filter_map(|window| match window.state {
                State::Waiting { start, .. } => Some(start),
                State::Open { end, .. } => Some(end),
                State::Always { .. } | State::Closed => None,
            })
            .min()
    }

    /// Opens the windows whose time has come, closes those whose time is
    /// up.
    pub fn switch(&mut self, now: Instant, scopes: &mut Scopes) {
        for (&root, window) in &mut self.roots {
            match std::mem::replace(&mut window.state, State::Closed) {
                State::Waiting { start, end } if now >= start => {
                    let mut before = Vec::new();
                    // For a window: on the main thread (fewer events to
                    // open and close each time; once it has ended, on
                    // every thread running).
                    // Its allowance before it traps (what is left of the
                    // last window's would cut this one short).
                    if window.allowance > 0 {
                        scopes.allow(root, window.allowance);
                    }
                    let tree = scopes.put_in(root, Threads::Main, |tree| before = cpu_times(tree));
                    // In, and counted, from now.
                    let since = Instant::now();
                    let cpu = midpoints(&before, &cpu_times(&tree));
                    window.state = State::Open { since, end, cpu };
                }
                State::Open { since, end, cpu } if now >= end => {
                    window.close(root, since, &cpu, scopes);
                }
                state => window.state = state,
            }
        }
    }
}

impl Windows {
    /// A process of `root`'s tree has spent its allowance: its probes go
    /// out now, for the rest of the span (one whose span has not begun,
    /// new since the last period, ends its first span at the next). What
    /// was counted is scaled by the CPU time its processes had while in:
    /// from `base` (each one's CPU time when its span began; None: not
    /// known, it is estimated by the share of the time) to now, for each
    /// of `tree`, the root's processes.
    pub fn cut(
        &mut self,
        root: u32,
        tree: &[u32],
        now: Instant,
        base: impl Fn(u32) -> Option<u64>,
        scopes: &mut Scopes,
    ) {
        let window = self.roots.entry(root).or_insert_with(|| Window {
            state: State::Always {
                since: scopes.scoped_since(root).unwrap_or(now),
                cpu: Vec::new(),
            },
            allowance: 0,
            periods_left: 1,
            span_start: scopes.scoped_since(root).unwrap_or(now),
            in_secs: 0.0,
            cpu_in: HashMap::new(),
            last_out: None,
            out_before: None,
        });
        match std::mem::replace(&mut window.state, State::Closed) {
            State::Always { since, cpu } => {
                let mut opened: HashMap<u32, u64> = cpu.into_iter().collect();
                for &pid in tree {
                    if let Some(cpu) = base(pid) {
                        opened.entry(pid).or_insert(cpu);
                    }
                }
                let opened: Vec<(u32, u64)> = opened.into_iter().collect();
                window.close(root, since, &opened, scopes);
                // The span ends at the next period's end.
                window.periods_left = 1;
            }
            State::Open { since, cpu, .. } => window.close(root, since, &cpu, scopes),
            state => window.state = state,
        }
    }

    /// How much of `root`'s span so far its probes were in, and each
    /// process's CPU time then, for a process that ended mid-span
    /// (`end_cpu`: its CPU time at its end), to be scaled to its end.
    pub fn so_far(&self, root: u32, now: Instant, pid: u32, end_cpu: u64) -> Option<Ended> {
        let window = self.roots.get(&root)?;
        let secs = now
            .duration_since(window.span_start)
            .as_secs_f64()
            .max(1e-3);
        let mut in_secs = window.in_secs;
        let mut cpu_in = window.cpu_in.get(&pid).copied();
        match &window.state {
            // In all along: counted whole.
            State::Always { .. } => return None,
            State::Open { since, cpu, .. } => {
                in_secs += now.duration_since(*since).as_secs_f64();
                if let Some(&(_, then)) = cpu.iter().find(|&&(p, _)| p == pid) {
                    *cpu_in.get_or_insert(0) += end_cpu.saturating_sub(then);
                }
            }
            State::Waiting { .. } | State::Closed => {}
        }
        Some(Ended {
            secs,
            share: (in_secs / secs).min(1.0),
            // None seen by a window: none counted (0).
            cpu_in: Some(HashMap::from([(pid, cpu_in.unwrap_or(0))])),
            unseen_since: window.out_before,
        })
    }
}

impl Window {
    fn went_out(&mut self, now: Instant) {
        self.out_before = self.last_out.or(Some(now));
        self.last_out = Some(now);
    }

    /// The window that opened at `since` (its processes' CPU times then:
    /// `opened`) closes: `root`'s probes go out; its time and its
    /// processes' CPU time while counted.
    fn close(&mut self, root: u32, since: Instant, opened: &[(u32, u64)], scopes: &mut Scopes) {
        let pids: Vec<u32> = opened.iter().map(|&(pid, _)| pid).collect();
        let before = cpu_times(&pids);
        let mut after = Vec::new();
        scopes.take_out(root, |_| after = cpu_times(&pids));
        self.in_secs += since.elapsed().as_secs_f64();
        self.went_out(Instant::now());
        let closed: HashMap<u32, u64> = midpoints(&before, &after).into_iter().collect();
        for &(pid, then) in opened {
            if let Some(&time) = closed.get(&pid) {
                *self.cpu_in.entry(pid).or_default() += time.saturating_sub(then);
            }
        }
        self.state = State::Closed;
    }
}

/// The CPU times of `pids` (those still running).
fn cpu_times(pids: &[u32]) -> Vec<(u32, u64)> {
    pids.iter()
        .filter_map(|&pid| Some((pid, status::cpu_time_ns(pid)?)))
        .collect()
}

/// Each process's CPU time at the moment counting switched: midway between
/// a read just before and one just after (memprof preempted between the
/// switch and a single read, the window's CPU time missed what its
/// counted calls took: estimates came out up to twice the truth on a busy
/// host).
fn midpoints(before: &[(u32, u64)], after: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let after: HashMap<u32, u64> = after.iter().copied().collect();
    before
        .iter()
        .filter_map(|&(pid, a)| Some((pid, a + after.get(&pid)?.saturating_sub(a) / 2)))
        .collect()
}
