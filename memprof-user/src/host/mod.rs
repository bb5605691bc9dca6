//! What memprof reads of the host and the processes on it: /proc, ELF
//! files and their identity, and parsers of untrusted input run under a
//! guard, files other processes control opened without trusting them, the
//! capabilities memprof keeps once set up, and whether it is to stop.
pub mod elf;
pub mod files;
pub mod gopclntab;
pub mod gotypes;
pub mod guard;
pub mod pidfd;
pub mod privileges;
pub mod procfs;
pub mod stop;
pub mod untrusted;
