//! The `memprof` binary: parses the command line, runs the command, and
//! turns its result into an exit status (see the library for the rest).
use std::process::ExitCode;

use clap::{error::ErrorKind, CommandFactory as _, Parser as _};
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
            // --help, --version (with what this host has).
            let _ = err.print();
            if err.kind() == ErrorKind::DisplayVersion {
                println!("{}", commands::bpf_features());
            }
            return ExitCode::SUCCESS;
        }
        Err(err) if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // A bare `memprof`.
            eprint!("{}", short_usage());
            return ExitCode::from(2);
        }
        Err(err) => {
            eprintln!(
                "memprof: error: {} (see memprof --help)",
                one_line_usage_error(&err)
            );
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

/// clap's error on one line, not its usage block: the message (which may
/// go on over indented lines, a list of missing arguments, up to the first
/// blank line) and its tip ("a similar argument exists: '--format'").
fn one_line_usage_error(err: &clap::Error) -> String {
    let rendered = err.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let mut message = message.join(" ");
    if let Some(tip) = rendered
        .lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix("tip: "))
    {
        message.push_str("; ");
        message.push_str(tip);
    }
    message.trim_start_matches("error: ").to_string()
}

/// What a bare `memprof` prints: the commands, a line each, and where the
/// rest is.
fn short_usage() -> String {
    let mut command = Cli::command();
    let mut out = format!(
        "memprof: which line of code allocated the memory?\n\n{}\n\nCommands:\n",
        command.render_usage()
    );
    for sub in command.get_subcommands().filter(|s| s.get_name() != "help") {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        let first = about.split(':').next().unwrap_or_default();
        out.push_str(&format!("  {:<12} {first}\n", sub.get_name()));
    }
    out.push_str("\n`memprof COMMAND -h` for its options, `memprof --help` for more.\n");
    out
}
