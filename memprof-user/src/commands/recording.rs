//! When calls are recorded: `--delay`, `--start-on`, `--toggle-on` flip
//! the kernel's switch (`PAUSED`); the report lists the windows recorded
//! and `--while`'s functions.
use std::{pin::Pin, time::Duration};

use anyhow::Result;
use aya::Ebpf;
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

use crate::{cli::profile::RegionOptions, probes, report::model::RecordingReport};

pub struct Recording {
    options: RegionOptions,
    /// Taken over from the start: a signal memprof does not handle would
    /// end it (USR1's default action).
    start_signal: Option<tokio::signal::unix::Signal>,
    toggle_signal: Option<tokio::signal::unix::Signal>,
    delay: Option<Pin<Box<tokio::time::Sleep>>>,
    delay_over: bool,
    started: bool,
    toggled_off: bool,
    /// Recorded windows, seconds since profiling started; the last one
    /// open while recording.
    windows: Vec<(f64, Option<f64>)>,
}

/// What changed the switch.
pub enum Change {
    DelayOver,
    StartSignal,
    ToggleSignal,
}

impl Recording {
    /// Must run inside the runtime, before the target runs.
    pub fn new(options: &RegionOptions) -> Result<Recording> {
        let listen = |signal_to: Option<Signal>| -> Result<_> {
            signal_to
                .map(|s| signal(SignalKind::from_raw(s as i32)))
                .transpose()
                .map_err(Into::into)
        };
        let mut recording = Recording {
            options: options.clone(),
            start_signal: listen(options.start_on)?,
            toggle_signal: listen(options.toggle_on)?,
            delay: None,
            delay_over: options.delay.is_none(),
            started: options.start_on.is_none(),
            toggled_off: false,
            windows: Vec::new(),
        };
        if recording.records() {
            recording.windows.push((0.0, None));
        }
        Ok(recording)
    }

    /// Profiling starts now: --delay counts from here.
    pub fn begin(&mut self) {
        self.delay = self
            .options
            .delay
            .map(|secs| Box::pin(tokio::time::sleep(Duration::from_secs_f64(secs))));
    }

    fn records(&self) -> bool {
        self.delay_over && self.started && !self.toggled_off
    }

    /// Whether anything can still change the switch.
    pub fn may_change(&self) -> bool {
        self.delay.is_some() || self.start_signal.is_some() || self.toggle_signal.is_some()
    }

    /// The next change (pending forever when none can come).
    pub async fn changed(&mut self) -> Change {
        tokio::select! {
            _ = async { self.delay.as_mut().unwrap().await }, if self.delay.is_some() => Change::DelayOver,
            _ = async { self.start_signal.as_mut().unwrap().recv().await }, if self.start_signal.is_some() => Change::StartSignal,
            _ = async { self.toggle_signal.as_mut().unwrap().recv().await }, if self.toggle_signal.is_some() => Change::ToggleSignal,
        }
    }

    /// Applies a change to the kernel's switch at `secs` of the profile.
    pub fn apply(&mut self, change: Change, ebpf: &mut Ebpf, secs: f64) -> Result<()> {
        let before = self.records();
        match change {
            Change::DelayOver => {
                self.delay = None;
                self.delay_over = true;
            }
            // Later ones are ignored (the stream stays, so they are caught).
            Change::StartSignal => self.started = true,
            Change::ToggleSignal => self.toggled_off = !self.toggled_off,
        }
        let now = self.records();
        if now != before {
            probes::set_paused(ebpf, !now)?;
            match now {
                true => self.windows.push((secs, None)),
                false => {
                    if let Some(last) = self.windows.last_mut() {
                        last.1 = Some(secs);
                    }
                }
            }
        }
        Ok(())
    }

    /// What the report says of it at `secs`; none when everything was
    /// recorded.
    pub fn report(&self, secs: f64) -> Option<RecordingReport> {
        let options = &self.options;
        options.is_limited().then(|| RecordingReport {
            while_functions: options
                .while_fns
                .iter()
                .map(|f| match &f.module {
                    Some(module) => format!("{}@{module}", f.symbol),
                    None => f.symbol.clone(),
                })
                .collect(),
            delay_secs: options.delay,
            start_on: options.start_on.map(|s| s.as_str().to_string()),
            toggle_on: options.toggle_on.map(|s| s.as_str().to_string()),
            windows: self
                .windows
                .iter()
                .map(|&(from, to)| [from, to.unwrap_or(secs).max(from)])
                .collect(),
        })
    }
}
