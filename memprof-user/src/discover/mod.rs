//! What to profile: checking pids, starting a command held, finding the
//! allocators and a process's Python interpreter.
pub mod allocators;
pub mod launch;
pub mod pid;
pub mod probe_offset;
pub mod python;
pub mod usdt;
