//! memprof, the allocation profiler, as a library: the `memprof` binary
//! is a thin entry over it, and the fuzzers and tests use its readers and
//! renderers.
//!
//! The data path, stage by stage: `discover` finds what to probe,
//! `probes` puts the kernel side in place, `unwind` keeps the kernel's
//! unwind tables, `collect` reads the kernel's maps and notices,
//! `symbolize` names the frames, `report` builds and renders; `monitor`
//! serves a profile that runs for days. `commands` drive a profile from
//! the options `cli` parses. Under them all, `host` reads /proc and the
//! files of profiled processes, and `human` says things to people.
pub mod cli;
pub mod collect;
pub mod commands;
pub mod discover;
pub mod host;
pub mod human;
pub mod monitor;
pub mod probes;
pub mod report;
pub mod symbolize;
pub mod unwind;
