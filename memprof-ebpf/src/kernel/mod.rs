//! The maps shared with user space and what reads the kernel: atomics,
//! task storage, struct offsets from BTF.
pub mod atomics;
pub mod maps;
pub mod offsets;
pub mod task_storage;
