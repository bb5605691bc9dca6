//! Whether memprof has been asked to stop (SIGTERM, SIGINT), seen from any
//! thread while the event loop is busy: long waits (symbolizing) end soon
//! after, so memprof ends within 2 s with its report.
use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
    time::Instant,
};

static ASKED: OnceLock<Arc<AtomicBool>> = OnceLock::new();
static SEEN_AT: OnceLock<Instant> = OnceLock::new();

/// From now on SIGTERM and SIGINT also raise the flag [`asked_at`] reads
/// (the event loop still takes them as before).
pub fn watch() -> std::io::Result<()> {
    let flag = ASKED.get_or_init(|| Arc::new(AtomicBool::new(false)));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, flag.clone())?;
    }
    Ok(())
}

/// When memprof was first seen to be asked to stop (at most one poll
/// after the signal), if it has been.
pub fn asked_at() -> Option<Instant> {
    let asked = ASKED.get()?.load(Ordering::Relaxed);
    asked.then(|| *SEEN_AT.get_or_init(Instant::now))
}
