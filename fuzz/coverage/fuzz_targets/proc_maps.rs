//! /proc/PID/maps lines, as a process's mappings make them (a path may
//! hold anything but a newline).
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::host::procfs::maps::{maps_line, parse_maps_line};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for line in text.lines() {
        let _ = maps_line(line);
        let _ = parse_maps_line(line);
    }
});
