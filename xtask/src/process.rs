//! Running commands: to their end (an error if they fail), or as children
//! that end when their guard is dropped.
use std::process::{Child, Command, Output};

use anyhow::{bail, Context as _, Result};

/// Runs `command` to its end: its output, or an error with its stderr if
/// it failed.
pub fn run(command: &mut Command) -> Result<Output> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// Kills the child on drop (a failed run must not leave probes in).
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A memprof asked to end (SIGTERM, so that it takes its probes out) and
/// waited for when dropped.
pub struct Terminated(pub Killed);

impl Drop for Terminated {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0 .0.id().to_string()])
            .status();
        let _ = self.0 .0.wait();
    }
}
