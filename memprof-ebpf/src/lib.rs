#![no_std]
// The BPF programs live in the `memprof` binary target (src/main.rs); this
// empty library lets memprof-user depend on the crate from its build.rs.
