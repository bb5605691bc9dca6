//! What to profile: checking pids, starting a command held, finding the allocators.
pub mod allocators;
pub mod launch;
pub mod pid;
pub mod probe_offset;
pub mod usdt;
