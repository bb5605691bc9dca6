//! The `memprof` binary: parses the command line, runs the command, and
//! turns its result into an exit status (see the library for the rest).
use std::process::ExitCode;

use clap::Parser as _;
use memprof::{
    cli::Cli,
    commands,
    human::error::{one_line, UserError},
    monitor, probes,
};

/// memprof's own allocations do not go through the C library's malloc:
/// on the whole host its probes are in every process, memprof's too, and
/// each of its calls there would take a trap (~1 µs) that its programs
/// then ignore.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // memprof's own helper processes.
    match std::env::args().nth(1).as_deref() {
        Some(monitor::calibrate::CHILD_ARG) => monitor::calibrate::child_main(),
        Some(probes::watchdog::CHILD_ARG) => probes::watchdog::child_main(),
        _ => {}
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help, --version
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) => {
            // One line, not clap's full usage block.
            // The message may go on over indented lines (a list of
            // missing arguments) up to the first blank line.
            let rendered = err.render().to_string();
            let message: Vec<&str> = rendered
                .lines()
                .take_while(|line| !line.trim().is_empty())
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.trim_start_matches("error: ");
            eprintln!("memprof: error: {message} (see memprof --help)");
            return ExitCode::from(2);
        }
    };
    match commands::run(cli) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(err) => {
            let code = err.downcast_ref::<UserError>().map_or(1, |e| e.exit_code);
            eprintln!("memprof: error: {}", one_line(&err));
            ExitCode::from(code.clamp(1, 255) as u8)
        }
    }
}
