//! What to profile: checking pids, starting a command held, finding libc.
pub mod elf;
pub mod launch;
pub mod libc;
pub mod pid;
pub mod probe_offset;
