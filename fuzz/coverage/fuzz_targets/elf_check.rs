//! The section check memprof runs before blazesym reads a profiled
//! process's file, and the build id reader.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::{host::elf::build_id, symbolize::elf_check};

fuzz_target!(|data: &[u8]| {
    let _ = elf_check::check(data);
    let _ = build_id(data);
});
