//! Turning return addresses into frames: function (demangled), file:line,
//! inlined functions, module. Uses the mappings captured while the
//! process was alive, so it works after the process has exited. The files
//! are read on a thread of their own, each within a time limit
//! ([`worker`]); [`reader`] reads them. [`python`] names Python frames,
//! [`go`] Go frames where a Go program has no DWARF.
pub mod copies;
mod debug_cache;
pub mod debug_files;
pub mod elf_check;
mod go;
pub mod python;
mod reader;
mod worker;

use std::borrow::Cow;

pub use worker::{Symbolizer, DEFAULT_TIME_LIMIT};

/// One frame of a reported stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// The return address (the same for a function and the frames inlined into it).
    pub address: u64,
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Path of the executable or library holding the address.
    pub module: Option<String>,
    /// Offset of the address in that file: the same in every run, unlike
    /// the address (ASLR).
    pub module_offset: Option<u64>,
    /// The file's GNU build id (hex), which names it across hosts.
    pub build_id: Option<String>,
    /// True for a function inlined into the frame that follows it.
    pub inlined: bool,
}

impl Frame {
    /// A frame of which nothing is known but its address.
    pub fn unknown(address: u64) -> Frame {
        Frame {
            address,
            function: None,
            file: None,
            line: None,
            module: None,
            module_offset: None,
            build_id: None,
            inlined: false,
        }
    }
}

/// A function's name for people: a mangled Rust or C++ name demangled
/// (Rust's without its hash), any other as it is. Only `_Z`/`_R` names
/// are mangled: a C function named `t` or `f` is no C++ type ("unsigned
/// short", "float", as blazesym's demangling showed them).
pub fn demangled(name: &str) -> Cow<'_, str> {
    if !name.starts_with("_Z") && !name.starts_with("_R") {
        return Cow::Borrowed(name);
    }
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return Cow::Owned(format!("{rust:#}"));
    }
    cpp_demangle::Symbol::new(name)
        .ok()
        .and_then(|symbol| symbol.demangle().ok())
        .map_or(Cow::Borrowed(name), Cow::Owned)
}

#[cfg(test)]
mod tests {
    use super::demangled;

    #[test]
    fn only_mangled_names_are_demangled() {
        // C functions whose names a C++ demangler reads as types.
        for name in ["t", "f", "i", "v", "main", "Ss"] {
            assert_eq!(demangled(name), name);
        }
        assert_eq!(demangled("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(
            demangled("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangled("_RNvCs1234_5crate4main"), "crate::main");
        // Not a valid mangled name: as it is.
        assert_eq!(demangled("_Z"), "_Z");
    }
}
