//! The USDT notes (`.note.stapsdt`) of a profiled process's file.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::discover::usdt::{parse_args, usdt_sites_in};

fuzz_target!(|data: &[u8]| {
    let _ = usdt_sites_in(data, "fuzzed");
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_args(text);
    }
});
