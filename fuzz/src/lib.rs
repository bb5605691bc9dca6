//! Fuzzing the readers of input memprof does not control: saved
//! JSON reports (`memprof report`, `memprof diff`), and the ELF and DWARF
//! files of profiled processes, as memprof's own readers take them (the
//! program's loader, the C library's allocator sites and probe offsets,
//! the loader's `r_debug` site, code segments, build ids) and as the
//! symbolizer does (blazesym, through a file). Inputs are real ones with
//! bytes flipped, overwritten, inserted, removed or truncated (most of them
//! in the ELF headers, symbol tables, notes and DWARF sections), JSON
//! reports with values replaced, removed or duplicated, and random bytes.
//!
//! Properties: nothing panics, and every error is one line.
//!
//! `cargo test -p memprof-fuzz` runs a short pass of each (`smoke_*`);
//! `cargo xtask fuzz --secs N` runs the ignored ones for N seconds each
//! (MEMPROF_FUZZ_SECS) and prints how many inputs each tried.
#[cfg(test)]
mod elf;
#[cfg(test)]
mod harness;
#[cfg(test)]
mod libraries;
#[cfg(test)]
mod mutate;
#[cfg(test)]
mod reports;
