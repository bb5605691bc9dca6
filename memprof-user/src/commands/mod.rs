//! The commands: `trace`, `attach` and `monitor` turn their options into
//! settings, put the probes in place and run a session to its end;
//! `report` and `diff` read saved reports.
mod attach;
mod doctor;
mod help_files;
mod monitor;
pub mod recording;
mod saved;
pub mod session;
mod trace;

use std::path::Path;

use anyhow::Result;

use crate::{
    cli::{Cli, Command, ProfileOptions},
    discover::allocators,
    human::error::UserError,
    probes::{self, Probes, Settings},
    report::options::SortKey,
    unwind,
};

pub use doctor::bpf_features;

pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Trace(args) => trace::trace(args),
        Command::Attach(args) => attach::attach(args),
        Command::Report(args) => saved::rerender(args),
        Command::Diff(args) => saved::diff(args),
        Command::Monitor(args) => monitor::monitor(*args),
        Command::Doctor => doctor::doctor(),
        Command::Completions(args) => help_files::completions(args),
        Command::Man(args) => help_files::man(args),
    }
}

/// memprof holds a perf event per process and uprobe event it scopes
/// (children given return probes, processes watched; per thread of a
/// process running at the attach): the soft limit on
/// open files goes up to the hard one (1,024 is a common soft limit).
pub(super) fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// The session-uprobe program, where `settings` use one.
pub(super) fn session_program(
    ebpf: &aya::Ebpf,
    settings: &Settings,
) -> Result<Option<std::os::fd::OwnedFd>> {
    match settings.session {
        probes::SessionProbes::Off => Ok(None),
        _ => probes::load_session_program(ebpf).map(Some),
    }
}

/// `--libc PATH` takes the place of the target's C library.
pub(super) fn with_libc(
    mut runtime: allocators::Runtime,
    libc: Option<&Path>,
) -> allocators::Runtime {
    if let Some(libc) = libc {
        runtime.modules.retain(|m| {
            !allocators::is_libc_name(m.file_name().and_then(|n| n.to_str()).unwrap_or(""))
        });
        runtime.modules.push(libc.to_path_buf());
    }
    runtime
}

/// `--verbose`: what was probed; and, always, targets with nothing to probe.
pub(super) fn tell_probes(probes: &Probes, verbose: bool) {
    if verbose {
        for function in &probes.functions {
            eprintln!("{}", probes::describe(function));
        }
        let sessions = probes.session_functions();
        if sessions > 0 {
            eprintln!(
                "memprof: session uprobes on {sessions} malloc-like functions: \
                 only sampled calls take a return probe"
            );
        }
    }
    for unprobed in probes.unprobed.iter().chain(&probes.partly_probed) {
        eprintln!(
            "memprof: warning: {}: {}",
            unprobed.program, unprobed.reason
        );
    }
}

/// At most what an allocator row (a byte in the probe's cookie) allows.
fn check_custom(options: &ProfileOptions) -> Result<()> {
    if options.target.alloc_fns.len() > 100 {
        return Err(UserError::new("at most 100 --alloc-fn functions")
            .with_exit_code(2)
            .into());
    }
    Ok(())
}

/// --sort live or temporary: only a live profile knows them.
pub(super) fn check_sort(sort: Option<SortKey>, live: bool) -> Result<()> {
    match sort {
        Some(key) if key.needs_live() && !live => Err(UserError::new(format!(
            "--sort {} needs a live profile (--live)",
            key.name()
        ))
        .with_exit_code(2)
        .into()),
        _ => Ok(()),
    }
}

/// Option values clap cannot check alone.
pub(super) fn check_options(options: &ProfileOptions) -> Result<()> {
    check_custom(options)?;
    check_sort(options.report.sort, options.live.live)?;
    let regions = &options.regions;
    if regions.start_on.is_some() && regions.start_on == regions.toggle_on {
        return Err(
            UserError::new("--start-on and --toggle-on need different signals")
                .with_exit_code(2)
                .into(),
        );
    }
    if options
        .sampling
        .sample_bytes
        .is_some_and(|bytes| bytes.0 == 0)
    {
        return Err(UserError::new("--sample-bytes must be at least 1 byte")
            .with_exit_code(2)
            .into());
    }
    Ok(())
}

/// `--unwind dwarf`: the kernel's unwind tables, with those of `pids`
/// loaded (before the probes fire).
pub(super) fn unwind_tables(
    ebpf: &aya::Ebpf,
    options: &ProfileOptions,
    pids: &[i32],
) -> Result<Option<unwind::kernel::KernelTables>> {
    if !options.stacks.unwind.tables() {
        return Ok(None);
    }
    let mut tables = unwind::kernel::KernelTables::open(ebpf)?;
    for &pid in pids {
        // A process that exits meanwhile needs none.
        let _ = tables.refresh(pid as u32);
    }
    Ok(Some(tables))
}

pub(super) fn tokio_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
