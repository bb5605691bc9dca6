//! What the programs share: call sites and their counters, stacks and the
//! unwinder, the live table and heaps, sampling, regions, process images
//! and threads. Built on `crate::kernel`, never on `crate::programs`.
pub mod alloc;
pub mod calls;
pub mod heap;
pub mod images;
pub mod live;
pub mod live_table;
pub mod loader;
pub mod mappings;
pub mod mode;
pub mod notices;
pub mod parent_watch;
pub mod process;
pub mod regions;
pub mod sampler;
pub mod session;
pub mod site_ids;
pub mod site_table;
pub mod sites;
pub mod stack_store;
pub mod stacks;
pub mod thread;
pub mod unwind;
pub mod usdt;
