//! The BPF programs: thin entry points, one file per group of hooks. Each
//! hands its context to the accounting it runs (`crate::accounting`).
mod alloc;
mod bench;
mod dispatch;
mod free;
mod loader;
mod mappings;
mod process;
mod regions;
mod session;
mod usdt;
