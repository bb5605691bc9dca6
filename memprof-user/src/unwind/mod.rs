//! Unwinding without frame pointers, user-space half: compile
//! each ELF file's CFI into a compact sorted table ([`table`]), keep the
//! tables by file ([`cache`]), and walk a stack over them ([`walk`]), the
//! way the BPF program will.
//!
//! # Tables
//!
//! One [`table::Row`] (8 bytes, `#[repr(C)]`) per address range where the rule
//! changes, sorted by address, addresses relative to the file's lowest
//! executable segment ([`table::UnwindTable::base`]). A row says how to find the
//! CFA (rsp + N, rbp + N, the PLT stubs' expression, the word at rbp + N),
//! where the caller's rbp is (unchanged, at CFA + N, unknown), or that
//! the walk ends there: outermost frame (return address undefined), no
//! FDE (a gap row wherever no FDE covers the code, so a lookup never
//! lands in the previous function's rule), or a rule rows cannot express.
//!
//! # The walk, step by step
//!
//! Start: `pc = rip`, `sp = rsp`, `bp = rbp` (known), frames = `[rip]`,
//! lookup address = `rip` (frame 0's instruction itself).
//!
//! 1. Stop if `max_frames` frames are recorded.
//! 2. Find the mapping holding the lookup address (binary search of the
//!    process's mappings sorted by start); none: stop.
//! 3. Find the row: the last row whose `pc <= lookup - bias - base`
//!    (binary search); none, or a gap row: stop (no unwind information).
//!    Outermost row: stop, the stack is complete. Unsupported: stop.
//! 4. CFA: `sp + off` (Rsp), `bp + off` (Rbp; stop if bp is unknown),
//!    `sp + off + ((pc & 15) >= aux ? 8 : 0)` (Plt), the word at
//!    `bp + off` (DerefRbp).
//! 5. Stop if `CFA <= sp`: the caller's stack pointer is the CFA, and
//!    stacks grow down, so a CFA not above sp is a loop or garbage.
//! 6. Return address (RA) = the word at `CFA - 8`; unreadable: stop.
//! 7. Caller's rbp: unchanged, the word at `CFA + 8 × aux` (unreadable:
//!    unknown), or unknown.
//! 8. Stop if RA = 0. The caller's lookup address is `RA - 1` (the call
//!    instruction: the return address may already be past the end of the
//!    caller's function, after a call to a noreturn function); stop if no
//!    executable mapping holds it (RA not recorded).
//! 9. Record RA; `pc = RA`, `sp = CFA`; go to 1.
//!
//! Stack words come from a copy of the stack taken at the probe (the BPF
//! side's 512-byte window), words beyond it read one by one.
//!
//! `--unwind dwarf` ([`kernel`]) loads the tables into the BPF maps the
//! kernel-side walker (memprof-ebpf's `unwind.rs`) reads; the walk there
//! is this one, step by step.
// Parts used by tests only (the reference walk, statistics).
#![cfg_attr(not(test), allow(dead_code))]

pub mod cache;
pub mod kernel;
pub mod process;
pub mod table;
pub mod walk;

#[cfg(test)]
mod tests;
