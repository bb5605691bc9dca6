//! Options turned into settings, in one place: what the kernel side is
//! loaded with (`probes::Settings`) and what is probed (`ProbeSet`), for
//! each kind of profile (`Mode`).
use std::os::fd::OwnedFd;

use super::ProfileOptions;
use crate::probes::{LiveSettings, Mode, ProbeSet, SessionProbes, Settings};

/// What the BPF object is loaded with. `max_processes`: the kernel's
/// process table (`monitor --max-processes`).
pub fn settings(options: &ProfileOptions, mode: Mode, max_processes: u32) -> Settings {
    let sample_bytes = options.sampling.sample_bytes.map_or(0, |bytes| bytes.0);
    Settings {
        max_stacks: options.limits.max_stacks,
        stack_map_size: options.limits.stack_map_size,
        live: options.live.live.then_some(LiveSettings {
            max_live: options.live.max_live,
            temp_threshold_ns: options.live.temp_threshold.nanos(),
            slots: options.live.live_slots,
            heap_slots: options.live.heap_slots,
        }),
        sample_bytes,
        unwind_rows: options
            .stacks
            .unwind
            .tables()
            .then_some(options.stacks.unwind_rows),
        mode,
        mappings: counts_mappings(options),
        regions: !options.regions.while_fns.is_empty(),
        start_paused: options.regions.starts_paused(),
        recording_limited: options.regions.is_limited(),
        max_processes,
        usdt: options.sampling.usdt,
        session: match options.dev.empty_programs || options.dev.no_session_probes {
            true => SessionProbes::Off,
            false => SessionProbes::for_profile(options.live.live, sample_bytes, mode.whole_host()),
        },
    }
}

/// What is probed. `session_program`: the session-uprobe program, where
/// the settings use one.
pub fn probe_set(
    options: &ProfileOptions,
    mode: Mode,
    session_program: Option<OwnedFd>,
) -> ProbeSet {
    let custom: Vec<_> = options
        .target
        .alloc_fns
        .iter()
        .chain(&options.target.free_fns)
        .chain(&options.regions.while_fns)
        .cloned()
        .collect();
    ProbeSet {
        live: options.live.live,
        empty_programs: options.dev.empty_programs,
        probe_offsets: !options.target.no_probe_offsets,
        bench_probe: options.dev.bench_probe.clone(),
        custom,
        verbose: options.progress.verbose,
        mappings: counts_mappings(options),
        python_allocators: !options.target.no_python_allocators,
        mode,
        usdt: options.sampling.usdt,
        session_program,
        hold_forks: mode.starts_processes() && !options.dev.no_fork_hold,
        site_groups: options.dev.site_groups,
        usdt_specs: options.dev.usdt_specs,
    }
}

/// Direct mappings are counted unless `--no-mmap`, and only with unwind
/// tables: whose a mapping is (the program's, or malloc's inside) takes
/// whole stacks, and glibc has no frame pointers.
fn counts_mappings(options: &ProfileOptions) -> bool {
    !options.target.no_mmap && options.stacks.unwind.tables()
}
