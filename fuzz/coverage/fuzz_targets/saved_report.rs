//! A saved JSON report (`memprof report`, `memprof diff`): parsed, cut
//! again and rendered as text; an error is one line.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memprof::report::{saved, text};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match saved::parse(text, "fuzzed.json") {
        Ok(mut report) => {
            report.escape_names();
            let _ = text::render(&report);
        }
        Err(err) => assert!(!format!("{err:#}").contains('\n')),
    }
});
