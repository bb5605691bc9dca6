//! What /proc says of a process: its memory maps, whether it runs, its
//! files as it sees them, its cgroups, and what its memory holds.
pub mod cgroups;
pub mod maps;
pub mod memory;
pub mod paths;
pub mod status;
