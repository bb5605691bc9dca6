//! `--unwind dwarf`: the call stack walked with the CFI tables user space
//! compiled from each mapped file (`UNWIND_ROWS`, `UNWIND_MAPS`), the
//! algorithm of memprof-user's `unwind` module (its `walk.rs` is the
//! reference), frame by frame in a `bpf_loop` callback: the verifier
//! checks one step, not every frame of a fixed loop.
//!
//! The walk starts at the allocator's caller: at the entry probe frame 0
//! is the allocator itself, whose CFA is rsp + 8, so its caller is the
//! word at rsp (`CallStack::caller`, read from the stack window), the
//! caller's stack pointer rsp + 8 and its rbp the probe's.
use core::ffi::c_void;

use aya_ebpf::{helpers::generated::bpf_loop, macros::map, maps::PerCpuArray};
use memprof_common::{
    lost::LostCause,
    sites::NO_STACK,
    stacks::{MAX_FRAMES, STACK_CUT},
    thread::{RegionFrames, ReturnAddress},
    unwind::{CfaKind, MappingEntry, ProcMappings, RbpKind, Row, MAX_MAPPINGS, PAGE_INDEX},
};

use crate::{
    accounting::stack_store::store,
    kernel::maps::{
        count_lost, FORKS, LAST_STACK, STACK_WINDOW, UNWIND_MAPS, UNWIND_ROWS, WINDOW_WORDS,
    },
};

/// Why a walk ended (`Walk::stop`).
const RUNNING: u64 = 0;

/// Outermost frame, return address 0, or a return address outside every
/// mapped file: the stack is complete.
const COMPLETE: u64 = 1;

const NO_INFO: u64 = 2;

const UNSUPPORTED: u64 = 3;

const READ_FAULT: u64 = 4;

const TOO_DEEP: u64 = 5;

/// A return address outside every mapping user space gave: the walk is
/// cut (see `ProcMappings`).
const OUTSIDE: u64 = 6;

/// Binary-search steps: enough for `MAX_MAPPINGS` mappings and for a
/// file of up to 2^24 - 1 rows (user space loads no larger file).
const MAPPING_STEPS: u32 = MAX_MAPPINGS.ilog2() + 1;

const ROW_STEPS: u32 = 24;

/// The walk's state, per CPU in a map rather than on the BPF stack: the
/// verifier does not track values in map memory, so the states of a
/// step (and of each binary-search iteration, see [`Search`]) do not
/// fork on every value the walk computes, and a step is verified once.
#[repr(C)]
pub struct Walk {
    tgid: u64,
    /// The frame's return address (its lookup address is `pc - 1`).
    pc: u64,
    sp: u64,
    bp: u64,
    /// Non-zero while `bp` is known.
    bp_known: u64,
    window_base: u64,
    window_ok: u64,
    /// Frames recorded in `LAST_STACK` (beyond the caller).
    len: u64,
    hash: u64,
    /// Non-zero once a frame differs from the last stack's.
    differs: u64,
    stop: u64,
    /// `--while`: the region calls' real return addresses (non-zero
    /// `has_regions`).
    has_regions: u64,
    regions: RegionFrames,
    /// The binary search under way.
    search: Search,
}

/// A binary search's bounds, kept in map memory between iterations
/// (volatile reads and writes): in registers the verifier would follow
/// each outcome of each comparison as its own path.
#[repr(C)]
struct Search {
    lo: u64,
    n: u64,
}

/// What each step gets through `bpf_loop`'s context pointer.
#[repr(C)]
struct StepContext {
    maps: &'static ProcMappings,
}

#[map]
static UNWIND_WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Walks the stack from the allocator's caller (`caller`, with the
/// caller's `sp` and `bp`); returns the key in `STACKS` of the frames
/// beyond the caller and [`STACK_CUT`] if the walk was cut short.
#[inline(always)]
pub fn walk(
    tgid: u32,
    caller: u64,
    sp: u64,
    bp: u64,
    window_base: u64,
    window_ok: bool,
    regions: Option<&RegionFrames>,
) -> (u64, u32) {
    let (Some(last), Some(state)) = (LAST_STACK.get_ptr_mut(0), UNWIND_WALK.get_ptr_mut(0)) else {
        return (NO_STACK, 0);
    };
    // SAFETY: this CPU's slot; BPF programs do not nest on a CPU here.
    let state = unsafe { &mut *state };
    state.tgid = tgid as u64;
    state.pc = caller;
    state.sp = sp;
    state.bp = bp;
    state.bp_known = 1;
    state.window_base = window_base;
    state.window_ok = window_ok as u64;
    state.len = 0;
    state.hash = 0xcbf2_9ce4_8422_2325;
    state.differs = 0;
    state.stop = RUNNING;
    state.has_regions = 0;
    if let Some(regions) = regions {
        state.has_regions = 1;
        state.regions = *regions;
    }
    // The process's mappings, looked up once: the steps get them through
    // the loop's context (a pointer on this stack frame).
    let Some(maps) = mappings_of(tgid) else {
        count_lost(LostCause::UnwindNoInfo);
        return (NO_STACK, STACK_CUT);
    };
    let mut context = StepContext { maps };
    // SAFETY: the callback reads `context` only, during the loop.
    unsafe {
        bpf_loop(
            MAX_FRAMES as u32 + 1,
            step as *mut c_void,
            (&mut context as *mut StepContext).cast(),
            0,
        )
    };
    let stop = match state.stop {
        // In no file memprof knows (a JIT's code; a library loaded or left
        // out since; garbage): a stack ends only where the tables say so.
        OUTSIDE => NO_INFO,
        stop => stop,
    };
    let cause = match stop {
        COMPLETE => None,
        NO_INFO => Some(LostCause::UnwindNoInfo),
        UNSUPPORTED => Some(LostCause::UnwindUnsupported),
        READ_FAULT => Some(LostCause::UnwindReadFault),
        // Every step ran: more frames than a stack keeps.
        _ => Some(LostCause::UnwindTooDeep),
    };
    let flags = match cause {
        Some(cause) => {
            count_lost(cause);
            STACK_CUT
        }
        None => 0,
    };
    let len = state.len as usize;
    if len == 0 || len > MAX_FRAMES {
        return (NO_STACK, flags);
    }
    // SAFETY: the per-CPU slot; BPF programs do not nest on a CPU here.
    (
        store(unsafe { &mut *last }, len, state.hash, state.differs),
        flags,
    )
}

/// One frame: `bpf_loop`'s callback; 1 ends the loop.
#[inline(never)]
extern "C" fn step(index: u64, ctx: *mut c_void) -> i64 {
    let Some(state) = UNWIND_WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's slot, set up by `walk`.
    let state = unsafe { &mut *state };
    // SAFETY: `walk` passes its `StepContext`.
    let maps = unsafe { (*ctx.cast::<StepContext>()).maps };
    let stop = advance(index, state, maps);
    if stop == RUNNING {
        0
    } else {
        state.stop = stop;
        1
    }
}

/// One step of the walk: the frame at `state.pc` recorded (but the
/// first, the caller's, kept apart), its row found, and the caller's
/// registers computed from it. `RUNNING` to go on, else why it ended.
#[inline(always)]
fn advance(index: u64, state: &mut Walk, maps: &ProcMappings) -> u64 {
    let lookup = state.pc.wrapping_sub(1);
    let mapping = match mapping_of(state, maps, lookup) {
        Ok(mapping) => mapping,
        Err(end) => return end,
    };
    if index > 0 {
        // A return address whose caller is mapped: record it.
        if let Err(end) = record_frame(state) {
            return end;
        }
    }
    let row = match row_of(state, mapping, lookup) {
        Ok(row) => row,
        Err(end) => return end,
    };
    unwind_by(state, row)
}

/// The mapping holding `lookup`: the last one starting at or below it.
#[inline(always)]
fn mapping_of<'a>(
    state: &mut Walk,
    maps: &'a ProcMappings,
    lookup: u64,
) -> Result<&'a MappingEntry, u64> {
    if maps.len == 0 {
        // An exec'd image whose tables are not loaded yet.
        return Err(NO_INFO);
    }
    let count = if (maps.len as u64) < MAX_MAPPINGS as u64 {
        maps.len as u64
    } else {
        MAX_MAPPINGS as u64
    };
    state.search.begin(count);
    for _ in 0..MAPPING_STEPS {
        let Some((lo, half)) = state.search.next() else {
            break;
        };
        let mid = lo + half;
        let below = maps.entries[mid as usize & (MAX_MAPPINGS - 1)].start <= lookup;
        state.search.narrow(below);
    }
    let lo = state.search.lo();
    if lo == 0 {
        return Err(OUTSIDE);
    }
    let mapping = &maps.entries[(lo - 1) as usize & (MAX_MAPPINGS - 1)];
    if lookup >= mapping.end {
        // Not in a mapped file (a JIT, or garbage): not recorded.
        return Err(OUTSIDE);
    }
    Ok(mapping)
}

/// `state.pc` as the next frame of the stack being built.
#[inline(always)]
fn record_frame(state: &mut Walk) -> Result<(), u64> {
    if state.len >= MAX_FRAMES as u64 {
        return Err(TOO_DEEP);
    }
    let Some(last) = LAST_STACK.get_ptr_mut(0) else {
        return Err(NO_INFO);
    };
    // SAFETY: the per-CPU slot; BPF programs do not nest on a CPU here.
    let frames = unsafe { &mut (*last).frames };
    let slot = state.len as usize & (MAX_FRAMES - 1);
    state.differs |= frames.ips[slot] ^ state.pc;
    frames.ips[slot] = state.pc;
    state.hash = (state.hash ^ state.pc).wrapping_mul(0x0100_0000_01b3);
    state.len += 1;
    Ok(())
}

/// The row for `lookup`: the last of the file's rows whose pc is at or
/// below the address relative to the table's base.
#[inline(always)]
fn row_of(state: &mut Walk, mapping: &MappingEntry, lookup: u64) -> Result<&'static Row, u64> {
    let relative = lookup.wrapping_sub(mapping.bias_plus_base);
    if relative > u32::MAX as u64 {
        return Err(NO_INFO);
    }
    let relative = relative as u32;
    let first = mapping.first_row;
    let (start, n) = page_rows(first, mapping.rows, relative);
    state.search.begin(n as u64);
    for _ in 0..ROW_STEPS {
        let Some((lo, half)) = state.search.next() else {
            break;
        };
        let mid = start.wrapping_add((lo + half) as u32);
        let Some(row) = UNWIND_ROWS.get(first.wrapping_add(mid)) else {
            return Err(NO_INFO);
        };
        let below = row.pc <= relative;
        state.search.narrow(below);
    }
    // Rows at or below the address: those below the page, and the page's.
    let at_or_below = start.wrapping_add(state.search.lo() as u32);
    if at_or_below == 0 {
        return Err(NO_INFO);
    }
    UNWIND_ROWS
        .get(first.wrapping_add(at_or_below - 1))
        .ok_or(NO_INFO)
}

/// The caller's pc, sp and rbp by `row`'s rule.
#[inline(always)]
fn unwind_by(state: &mut Walk, row: &Row) -> u64 {
    let aux = row.aux;
    let offset = row.cfa_offset() as u64;
    let cfa = match row.cfa_kind() {
        CfaKind::Rsp => state.sp.wrapping_add(offset),
        CfaKind::Rbp if state.bp_known != 0 => state.bp.wrapping_add(offset),
        CfaKind::Plt => {
            let pushed = if state.pc & 15 >= aux as u64 { 8 } else { 0 };
            state.sp.wrapping_add(offset).wrapping_add(pushed)
        }
        CfaKind::DerefRbp if state.bp_known != 0 => {
            let at = state.bp.wrapping_add(offset);
            match read_word(state, at) {
                Some(cfa) => cfa,
                None => return READ_FAULT,
            }
        }
        CfaKind::Outermost => return COMPLETE,
        CfaKind::Gap => return NO_INFO,
        // Another rule, or one that needs an unknown rbp.
        _ => return UNSUPPORTED,
    };
    if cfa <= state.sp {
        // The caller's stack pointer must lie above: a loop, or garbage.
        return READ_FAULT;
    }
    let Some(ra) = read_word(state, cfa - 8) else {
        return READ_FAULT;
    };
    let ra = match state.has_regions {
        0 => ra,
        _ => match state.regions.real_return(cfa - 8, ra) {
            ReturnAddress::Real(ra) => ra,
            // An older region call's: its real address was not kept.
            ReturnAddress::Lost => return NO_INFO,
        },
    };
    match row.rbp_kind() {
        RbpKind::Unchanged => {}
        RbpKind::AtCfa => {
            // An unreadable slot makes rbp unknown: only a caller whose
            // CFA needs it stops.
            let at = cfa.wrapping_add(row.rbp_offset() as u64);
            match read_word(state, at) {
                Some(bp) => state.bp = bp,
                None => state.bp_known = 0,
            }
        }
        RbpKind::Undefined => state.bp_known = 0,
    }
    if ra == 0 {
        return COMPLETE;
    }
    state.pc = ra;
    state.sp = cfa;
    RUNNING
}

/// The rows to search for `relative`'s row, as `(start, n)`: the `n` rows
/// from `start` that begin in its page, from the page index after the
/// file's `rows` rows (`PAGE_INDEX`); all of them if the index is not
/// there or does not make sense.
#[inline(always)]
fn page_rows(first: u32, rows: u32, relative: u32) -> (u32, u32) {
    let index = first.wrapping_add(rows);
    let Some(header) = UNWIND_ROWS.get(index) else {
        return (0, rows);
    };
    let pages = header.pc;
    if header.kind != PAGE_INDEX || pages == 0 {
        return (0, rows);
    }
    // Past the last page: its rows (the file's last) hold the answer.
    let page = core::cmp::min(relative >> (header.aux as u32 & 31), pages - 1);
    let Some(start) = UNWIND_ROWS.get(index.wrapping_add(1).wrapping_add(page)) else {
        return (0, rows);
    };
    let end = if page + 1 < pages {
        match UNWIND_ROWS.get(index.wrapping_add(2).wrapping_add(page)) {
            Some(next) => next.pc,
            None => return (0, rows),
        }
    } else {
        rows
    };
    if start.pc > end || end > rows {
        return (0, rows);
    }
    (start.pc, end - start.pc)
}

impl Search {
    /// A search over `n` elements: finds how many come at or below the
    /// target (they are sorted).
    #[inline(always)]
    fn begin(&mut self, n: u64) {
        // SAFETY: plain writes to this CPU's slot.
        unsafe {
            core::ptr::write_volatile(&mut self.lo, 0);
            core::ptr::write_volatile(&mut self.n, n);
        }
    }

    /// The next element to compare (`lo + half`), as `(lo, half)`; `None`
    /// when the search is done.
    #[inline(always)]
    fn next(&self) -> Option<(u64, u64)> {
        // SAFETY: plain reads of this CPU's slot.
        let (lo, n) = unsafe {
            (
                core::ptr::read_volatile(&self.lo),
                core::ptr::read_volatile(&self.n),
            )
        };
        (n != 0).then_some((lo, n / 2))
    }

    /// The element compared was at or below the target (`below`), or not.
    #[inline(always)]
    fn narrow(&mut self, below: bool) {
        // SAFETY: plain reads and writes of this CPU's slot.
        unsafe {
            let (lo, n) = (
                core::ptr::read_volatile(&self.lo),
                core::ptr::read_volatile(&self.n),
            );
            let half = n / 2;
            if below {
                core::ptr::write_volatile(&mut self.lo, lo + half + 1);
                core::ptr::write_volatile(&mut self.n, n - half - 1);
            } else {
                core::ptr::write_volatile(&mut self.n, half);
            }
        }
    }

    /// Elements at or below the target.
    #[inline(always)]
    fn lo(&self) -> u64 {
        // SAFETY: a plain read of this CPU's slot.
        unsafe { core::ptr::read_volatile(&self.lo) }
    }
}

/// The process's mappings: for a forked child not refreshed yet, its
/// parent's (the same address space, unless it exec'd: then `on_exec` left
/// an empty entry for it).
#[inline(always)]
fn mappings_of(tgid: u32) -> Option<&'static ProcMappings> {
    // SAFETY: read-only looks at the maps.
    unsafe {
        match UNWIND_MAPS.get(tgid) {
            Some(maps) => Some(maps),
            None => UNWIND_MAPS.get(*FORKS.get(tgid)?),
        }
    }
}

/// An exec'd process's entry until user space reads its new mappings.
pub static NO_MAPPINGS: ProcMappings = ProcMappings {
    len: 0,
    reserved: 0,
    entries: [MappingEntry {
        start: 0,
        end: 0,
        bias_plus_base: 0,
        first_row: 0,
        rows: 0,
    }; MAX_MAPPINGS],
};

/// The stack word at `addr`: from the window copied at the probe when it
/// holds it. Beyond it, the window moves up to `addr` (from 8 words
/// below it, where a frame's saved registers lie): one read of user
/// memory costs about the same whatever its size up to 512 bytes, and the
/// next frames usually lie in the next few hundred bytes. Should that
/// read fail (the window would run past the top of the stack), the word
/// is read alone.
#[inline(always)]
fn read_word(state: &mut Walk, addr: u64) -> Option<u64> {
    let offset = addr.wrapping_sub(state.window_base);
    if state.window_ok != 0 && offset <= (WINDOW_WORDS as u64 - 1) * 8 && offset & 7 == 0 {
        let words = STACK_WINDOW.get_ptr(0)?;
        // SAFETY: this CPU's window, filled at the probe; the mask shows
        // the verifier the index is in bounds.
        return Some(unsafe { (*words)[(offset / 8) as usize & (WINDOW_WORDS - 1)] });
    }
    if state.window_ok != 0 && addr & 7 == 0 && addr > state.window_base {
        let base = addr - SLIDE_BELOW * 8;
        let words = STACK_WINDOW.get_ptr_mut(0)?;
        // SAFETY: a checked read of user memory into this CPU's window.
        let status = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                words.cast(),
                (WINDOW_WORDS * 8) as u32,
                base as *const _,
            )
        };
        if status == 0 {
            state.window_base = base;
            // SAFETY: the window, filled just now.
            return Some(unsafe { (*words)[SLIDE_BELOW as usize] });
        }
        // A failed read leaves the window zeroed.
        state.window_ok = 0;
    }
    // SAFETY: a checked read of user memory.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const u64) }.ok()
}

/// Words of the moved window below the word asked for.
const SLIDE_BELOW: u64 = 8;
