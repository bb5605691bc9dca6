//! The unwind-table compiler on a profiled process's CFI
//! (.eh_frame, .debug_frame), and a lookup in what it made.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::unwind::table::compile;

fuzz_target!(|data: &[u8]| {
    if let Ok(table) = compile(data) {
        for address in [0, 0x1000, 0x40_0000, u64::MAX] {
            let _ = table.lookup(address);
        }
    }
});
