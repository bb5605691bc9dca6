//! The timeline renderers (SVG, Chrome trace) on a saved report.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::report::{chrome, saved, timeline_svg};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(mut report) = saved::parse(text, "fuzzed.json") {
        report.escape_names();
        let _ = timeline_svg::render(&report);
        let _ = chrome::render(&report);
    }
});
