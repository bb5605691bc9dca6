//! The query of a request to monitor's endpoints.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::monitor::http::query_pairs;

fuzz_target!(|data: &[u8]| {
    if let Ok(query) = std::str::from_utf8(data) {
        let _ = query_pairs(query);
    }
});
