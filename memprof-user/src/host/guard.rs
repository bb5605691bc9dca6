//! Running a parser on untrusted input (a file a profiled process maps)
//! so that a panic inside it fails that input alone: the caller gets one
//! line, stderr gets no panic message and backtrace, and the session (and
//! the profile of every other process) goes on.
use std::{
    any::Any,
    cell::{Cell, RefCell},
    collections::BTreeMap,
    panic::{self, AssertUnwindSafe},
    sync::{Mutex, Once},
};

thread_local! {
    /// Above 0 while `contained` runs on this thread: its panics are caught.
    static QUIET: Cell<u32> = const { Cell::new(0) };
    /// Where the last caught panic happened.
    static LOCATION: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Panics caught so far, by where they happened (the fuzzers report them).
static CAUGHT: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Where caught panics happened, and how many times each.
pub fn caught_panics() -> BTreeMap<String, u64> {
    CAUGHT.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Runs `work`; a panic in it becomes `Err` with one line: what panicked,
/// and where. The work's state may be left half-updated: drop it or start
/// it again.
pub fn contained<T>(work: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    QUIET.with(|quiet| quiet.set(quiet.get() + 1));
    let result = panic::catch_unwind(AssertUnwindSafe(work));
    QUIET.with(|quiet| quiet.set(quiet.get() - 1));
    result.map_err(|payload| {
        let location = LOCATION.with(|location| location.borrow_mut().take());
        let message = one_line(&panic_message(payload.as_ref()));
        match location {
            Some(location) => format!("panicked at {location}: {message}"),
            None => format!("panicked: {message}"),
        }
    })
}

/// What a panic said, from its payload.
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        text.to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(no message)".to_string()
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Once per process: panics inside `contained` are recorded, not printed;
/// all others go to the hook that was there before.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let caught = QUIET.try_with(Cell::get).unwrap_or(0) > 0;
            if caught {
                let location = info.location().map(|l| l.to_string());
                *CAUGHT
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(location.clone().unwrap_or_default())
                    .or_default() += 1;
                let _ = LOCATION.try_with(|slot| *slot.borrow_mut() = location);
            } else {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_is_one_line() {
        let caught = contained(|| -> u32 { panic!("two\nlines") }).unwrap_err();
        assert!(caught.starts_with("panicked at "), "{caught}");
        assert!(caught.ends_with(": two lines"), "{caught}");
        assert!(!caught.contains('\n'));
        assert_eq!(contained(|| 7), Ok(7));
    }

    #[test]
    fn nested_contained_panics_stay_contained() {
        let outer = contained(|| {
            let inner = contained(|| -> () { panic!("inner") });
            assert!(inner.is_err());
            panic!("outer")
        });
        assert!(outer.unwrap_err().ends_with("outer"));
    }
}
