//! `memprof trace -- CMD`: the command started held, profiled with the
//! processes it starts until it exits.
use anyhow::Result;

use super::{
    check_options, raise_fd_limit, session_program, tell_probes, tokio_runtime, unwind_tables,
    with_libc,
};
use crate::{
    cli::{
        settings::{probe_set, settings},
        TraceArgs,
    },
    commands::{
        recording::Recording,
        session::{Profiled, Session},
    },
    discover::{allocators, launch, pid},
    human::error::one_line,
    probes::{self, Mode, Probes},
    report,
};

pub(super) fn trace(args: TraceArgs) -> Result<i32> {
    check_options(&args.options)?;
    report::check_output(args.options.report.output.as_deref())?;
    let run_as = launch::run_as(args.run_as.user.as_deref())?;
    let program = launch::resolve_program(&args.command[0])?;
    pid::check_privileges()?;
    let runtime = with_libc(
        allocators::runtime_of_program(&program)?,
        args.options.target.libc.as_deref(),
    );
    let static_program = runtime.loader.is_none();
    let mode = Mode::Trace { static_program };
    let settings = settings(&args.options, mode, probes::MAX_PROCESSES);
    let mut ebpf = probes::load(&settings)?;
    // Lets go what memprof stopped if memprof cannot (it is told when the
    // profile ended well).
    let watchdog = probes::watchdog::Watchdog::start(&ebpf)
        .inspect_err(|err| eprintln!("memprof: warning: {}", one_line(err)))
        .ok();
    let session_program = session_program(&ebpf, &settings)?;
    // The command's tables are loaded when its exec is announced.
    let unwind = unwind_tables(&ebpf, &args.options, &[])?;
    let child = launch::HeldChild::spawn(&program, &args.command, run_as.as_ref())?;
    // Forked already: the command runs with the limit it was given.
    raise_fd_limit();
    if static_program {
        // Known to the kernel before its exec, which then holds it.
        probes::register_targets(&mut ebpf, &[child.pid.as_raw()], args.options.live.live)?;
    }
    let set = probe_set(&args.options, mode, session_program);
    allocators::register_custom(&set.custom);
    let probes = Probes::attach(&mut ebpf, &[runtime], &[child.pid.as_raw()], set)?;
    tell_probes(&probes, args.options.progress.verbose);
    let runtime = tokio_runtime()?;
    // Its signals are memprof's before the command can send them.
    let recording = {
        let _inside = runtime.enter();
        Recording::new(&args.options.regions)?
    };
    let pid = child.release(&program)?;
    let session = Session {
        ebpf,
        probes,
        options: args.options,
        duration: None,
        unwind,
        recording,
        listener: None,
        out: None,
        watch: None,
        evict_after: None,
        budget: None,
        periods: None,
    };
    let status = runtime.block_on(session.run(Profiled::Command(pid)))?;
    if let Some(watchdog) = watchdog {
        watchdog.all_released();
    }
    Ok(status)
}
