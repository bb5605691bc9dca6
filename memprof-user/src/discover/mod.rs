//! What to profile: checking pids, starting a command held, finding the
//! allocators, a process's Python interpreter and Go programs.
pub mod allocators;
pub mod go;
pub mod launch;
pub mod pid;
pub mod probe_offset;
pub mod python;
pub mod usdt;
