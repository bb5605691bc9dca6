//! What memprof reads of the host and the processes on it: ELF files, and
//! parsers of untrusted input run under a guard.
pub mod elf;
pub mod guard;
