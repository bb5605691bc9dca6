//! Parsers of option values clap cannot parse alone.
use std::str::FromStr;

use nix::sys::signal::Signal;

use crate::discover::allocators::CustomFunction;

pub fn alloc_fn(text: &str) -> Result<CustomFunction, String> {
    CustomFunction::parse(text, false)
}

pub fn free_fn(text: &str) -> Result<CustomFunction, String> {
    CustomFunction::parse(text, true)
}

pub fn region_fn(text: &str) -> Result<CustomFunction, String> {
    CustomFunction::region(text)
}

/// A signal memprof may take for itself: not one that ends the profile
/// (INT, TERM), nor one it cannot catch or must not (KILL, STOP, CHLD,
/// the fault signals).
pub fn signal(text: &str) -> Result<Signal, String> {
    let upper = text.trim().to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    let signal: Signal = name
        .parse()
        .map_err(|_| format!("'{text}' is not a signal name (try USR1, USR2 or HUP)"))?;
    use Signal::*;
    if matches!(
        signal,
        SIGINT
            | SIGTERM
            | SIGKILL
            | SIGSTOP
            | SIGCHLD
            | SIGSEGV
            | SIGBUS
            | SIGILL
            | SIGFPE
            | SIGTRAP
            | SIGABRT
            | SIGSYS
    ) {
        return Err(format!(
            "{} cannot be used: INT and TERM end the profile; try USR1, USR2 or HUP",
            signal.as_str()
        ));
    }
    Ok(signal)
}

pub fn positive_percent(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(pct) if pct > 0.0 && pct <= 100.0 => Ok(pct),
        _ => Err(format!("'{text}' is not a percentage in (0, 100]")),
    }
}

/// A time span of more than zero seconds (a period).
pub fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<Seconds>()? {
        Seconds(secs) if secs > 0.0 && secs < 1e9 => Ok(secs),
        _ => Err("must be more than 0 seconds".to_string()),
    }
}

/// A time span given as seconds (`0.5`, `30`) or with a unit (`1ms`, `5m`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Seconds(pub f64);

impl Seconds {
    pub fn nanos(self) -> u64 {
        (self.0 * 1e9) as u64
    }
}

impl FromStr for Seconds {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || format!("'{s}' is not a time span (try 30, 0.5, 1ms or 5m)");
        if let Ok(secs) = s.parse::<f64>() {
            return (secs.is_finite() && secs >= 0.0)
                .then_some(Seconds(secs))
                .ok_or_else(invalid);
        }
        humantime::parse_duration(s)
            .map(|d| Seconds(d.as_secs_f64()))
            .map_err(|_| invalid())
    }
}
