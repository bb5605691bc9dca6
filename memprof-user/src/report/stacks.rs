//! The stacks of one process, from the kernel's keys to what a report
//! shows: every address symbolized once, stacks summed by what they read
//! as (or by caller), sorted, cut, and only then their frames written out.
use std::{
    collections::{btree_map::Entry, BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use memprof_common::{
    allocators::GO_MALLOCGC,
    sites::{AllocKey, AllocStats, NO_STACK},
};

use super::{
    filters::StackFilter,
    model::{FrameReport, HiddenReport, LiveStackReport, StackReport},
};
use crate::{
    collect::{catalog::ProcessInfo, Snapshot},
    discover::allocators::allocator_name,
    report::options::{GroupBy, ReportOptions, SortKey},
    symbolize::{Frame, Symbolizer},
};

/// The frames of every address of one process's stacks, symbolized in
/// one batch, each written out once.
struct FrameTable {
    by_address: HashMap<u64, AddressFrames>,
    /// Go types by the address of their descriptor, where named.
    go_types: HashMap<u64, String>,
}

struct AddressFrames {
    /// The function at the address, then those inlined into it... as the
    /// report lists them (innermost first).
    frames: Vec<Arc<FrameReport>>,
    /// What the frames read as, interned: equal ids, equal reading.
    identity: u32,
}

impl FrameTable {
    fn new(
        snapshot: &Snapshot,
        info: Option<&ProcessInfo>,
        symbolizer: &mut Symbolizer,
        sites: &[&(AllocKey, AllocStats)],
    ) -> FrameTable {
        // 0: a return address that could not be read, shown as such.
        let unique: BTreeSet<u64> = sites
            .iter()
            .flat_map(|(key, _)| addresses_of(snapshot, key))
            .filter(|&a| a != 0)
            .collect();
        let unique: Vec<u64> = unique.into_iter().collect();
        let symbolized = symbolizer.symbolize(info, &unique);
        let mut interned: HashMap<Vec<(FrameIdentity, bool)>, u32> = HashMap::new();
        let by_address = unique
            .iter()
            .zip(symbolized)
            .chain(std::iter::once((&0, Vec::new())))
            .map(|(&address, frames)| {
                let frames: Vec<Arc<FrameReport>> = if frames.is_empty() {
                    vec![Arc::new(frame_report(&Frame::unknown(address)))]
                } else {
                    frames.iter().map(|f| Arc::new(frame_report(f))).collect()
                };
                let reading: Vec<_> = frames
                    .iter()
                    .map(|f| (frame_identity(f), f.inlined))
                    .collect();
                let next = interned.len() as u32;
                let identity = *interned.entry(reading).or_insert(next);
                (address, AddressFrames { frames, identity })
            })
            .collect();
        // Each type with the code of one call that allocated it.
        let allocated: BTreeMap<u64, u64> = sites
            .iter()
            .filter_map(|(key, _)| Some((key.go_type()?, key.caller)))
            .collect();
        let (types, code): (Vec<u64>, Vec<u64>) = allocated.into_iter().unzip();
        let names = if types.is_empty() {
            Vec::new()
        } else {
            symbolizer.go_type_names(info, &types, &code)
        };
        let go_types = types
            .into_iter()
            .zip(names)
            .filter_map(|(address, name)| Some((address, name?)))
            .collect();
        FrameTable {
            by_address,
            go_types,
        }
    }

    /// What a call site's Go object reads as (see `StackReport::go_type`).
    fn go_type_of(&self, key: &AllocKey, probed: &str) -> Option<String> {
        if probed != GO_MALLOCGC {
            return None;
        }
        Some(match key.go_type() {
            None => UNTYPED.to_string(),
            Some(address) => self
                .go_types
                .get(&address)
                .cloned()
                .unwrap_or_else(|| format!("[type {address:#x}]")),
        })
    }

    fn frames_of(&self, address: u64) -> &[Arc<FrameReport>] {
        self.by_address
            .get(&address)
            .map_or(&[], |known| known.frames.as_slice())
    }

    /// What the stack reads as: one id per address.
    fn identity(&self, addresses: &[u64]) -> Vec<u32> {
        addresses
            .iter()
            .map(|a| self.by_address.get(a).map_or(u32::MAX, |k| k.identity))
            .collect()
    }

    /// Writes out the frames of a stack that will be shown, up to `depth`.
    fn write_frames(&self, stack: &mut StackReport, depth: usize) {
        if stack.addresses.is_empty() {
            return;
        }
        stack.frames = std::mem::take(&mut stack.addresses)
            .iter()
            .flat_map(|&address| self.frames_of(address).iter().cloned())
            .take(depth.max(1))
            .collect();
    }
}

/// The caller, then the deeper frames: the stack's return addresses.
fn addresses_of(snapshot: &Snapshot, key: &AllocKey) -> Vec<u64> {
    let deeper = snapshot
        .stacks
        .get(&key.stack)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    std::iter::once(key.caller)
        .chain(deeper.iter().copied())
        .collect()
}

/// Every stack of one process, summed by what it reads as (--group-by),
/// cut to what is shown, with its frames written out.
#[allow(clippy::too_many_arguments)]
pub fn shown_stacks(
    snapshot: &Snapshot,
    info: Option<&ProcessInfo>,
    symbolizer: &mut Symbolizer,
    sites: &[&(AllocKey, AllocStats)],
    live_of: impl Fn(&AllocKey, &AllocStats) -> Option<LiveStackReport>,
    options: &ReportOptions,
    drop_dead: bool,
) -> (Vec<StackReport>, StackTotals) {
    let table = FrameTable::new(snapshot, info, symbolizer, sites);
    let filter = StackFilter::of(options);
    let mut stacks = Vec::with_capacity(sites.len());
    let mut hidden = Vec::new();
    for (key, stats) in sites {
        let probed = allocator_name(key.allocator);
        let (allocator, addresses) =
            through_operator_new(&table, probed, addresses_of(snapshot, key));
        let (allocator, mut addresses) = through_go_runtime(&table, allocator, addresses);
        let kept = filter.keeps(
            addresses
                .iter()
                .flat_map(|&a| table.frames_of(a))
                .map(|f| &**f),
        );
        if kept {
            addresses.drain(..filter.skipped(addresses.len()));
        }
        let stack = StackReport {
            go_type: table.go_type_of(key, probed),
            allocator,
            bytes: stats.bytes,
            count: stats.count,
            partial: key.stack == NO_STACK || key.reserved & memprof_common::stacks::STACK_CUT != 0,
            samples: snapshot.sampling.then_some(stats.samples),
            // Frame 0 alone until the stack is shown: what
            // --group-by caller needs.
            frames: addresses
                .first()
                .and_then(|&a| table.frames_of(a).first().cloned())
                .into_iter()
                .collect(),
            addresses,
            sites: vec![*key],
            band: None,
            live: live_of(key, stats),
        };
        if kept { &mut stacks } else { &mut hidden }.push(stack);
    }
    let summed = |stacks| match options.group_by {
        GroupBy::Stack => merge_identical(stacks, &table),
        GroupBy::Caller => group_by_caller(stacks),
        GroupBy::Type => group_by_type(stacks),
    };
    let hidden = summed(hidden);
    let mut stacks = summed(stacks);
    let totals = StackTotals {
        bytes: stacks.iter().map(|s| s.bytes).sum(),
        count: stacks.iter().map(|s| s.count).sum(),
        stacks: stacks.len(),
        hidden_sites: hidden
            .iter()
            .flat_map(|s| s.sites.iter().copied())
            .collect(),
        hidden: filter.is_active().then(|| HiddenReport {
            hidden_bytes: hidden.iter().map(|s| s.bytes).sum(),
            hidden_count: hidden.iter().map(|s| s.count).sum(),
            hidden_stacks: hidden.len() as u64,
        }),
    };
    cut(&mut stacks, options, drop_dead);
    for stack in &mut stacks {
        table.write_frames(stack, options.shown_depth());
    }
    (stacks, totals)
}

/// C++: a `malloc` (or `aligned_alloc`) called by `operator new` is the
/// `new` expression's allocation. Its frames inside the operators are
/// dropped, so frame 0 is the code that called `new`, and the allocator
/// reads as the operator: `new`, `new[]`, `new(align)`, `new(nothrow)`,
/// `new[](align, nothrow)`… (the outermost operator's frame; Debian's
/// `new[]` jumps to `new`, leaving no frame, and reads as `new`). The only
/// frame left of a cut stack stays.
fn through_operator_new(
    table: &FrameTable,
    probed: &str,
    mut addresses: Vec<u64>,
) -> (String, Vec<u64>) {
    let mut allocator = probed.to_string();
    while addresses.len() > 1 {
        let Some(operator) = table
            .frames_of(addresses[0])
            .last()
            .and_then(|frame| frame.function.as_deref())
            .and_then(operator_new_label)
        else {
            break;
        };
        allocator = operator;
        addresses.remove(0);
    }
    (allocator, addresses)
}

/// Go: an allocation the runtime makes for user code (`make`, `append`
/// growth, `new`, a string concatenation, a map's buckets) is that
/// code's, as Go's own profiles have it. The runtime's frames above the
/// first frame outside it are dropped, and the allocator reads as the
/// runtime function the code called (`runtime.makeslice`,
/// `runtime.growslice`, `runtime.newobject`…). A stack all in the runtime
/// stays as it is, as does one through another `runtime.mallocgc`: the
/// runtime's own allocation while it allocates (a collection starting).
fn through_go_runtime(
    table: &FrameTable,
    allocator: String,
    addresses: Vec<u64>,
) -> (String, Vec<u64>) {
    if allocator != GO_MALLOCGC {
        return (allocator, addresses);
    }
    let function = |address: u64| {
        table
            .frames_of(address)
            .last()
            .and_then(|frame| frame.function.clone())
    };
    let in_runtime =
        |name: &Option<String>| name.as_deref().is_some_and(|n| n.starts_with("runtime."));
    let Some(user) = addresses.iter().position(|&a| !in_runtime(&function(a))) else {
        return (allocator, addresses);
    };
    let nested = addresses[..user].iter().any(|&address| {
        table
            .frames_of(address)
            .iter()
            .any(|frame| frame.function.as_deref() == Some(GO_MALLOCGC))
    });
    if user == 0 || nested {
        return (allocator, addresses);
    }
    let called = function(addresses[user - 1]).unwrap_or(allocator);
    (called, addresses[user..].to_vec())
}

/// "new[](align)" for "operator new[](unsigned long, std::align_val_t)".
fn operator_new_label(function: &str) -> Option<String> {
    let rest = function.strip_prefix("operator new")?;
    let (array, arguments) = match rest.strip_prefix("[]") {
        Some(arguments) => ("[]", arguments),
        None => ("", rest),
    };
    if !arguments.starts_with('(') {
        return None;
    }
    let align = arguments.contains("align_val_t");
    let nothrow = arguments.contains("nothrow_t");
    let qualifiers = match (align, nothrow) {
        (true, true) => "(align, nothrow)",
        (true, false) => "(align)",
        (false, true) => "(nothrow)",
        (false, false) => "",
    };
    Some(format!("new{array}{qualifiers}"))
}

/// Sums over all stacks of a process, before the cut (after the filters).
pub struct StackTotals {
    pub bytes: u64,
    pub count: u64,
    pub stacks: usize,
    /// With filters: what they hid.
    pub hidden: Option<HiddenReport>,
    /// The kernel's sites of the hidden stacks.
    pub hidden_sites: HashSet<AllocKey>,
}

fn frame_report(frame: &Frame) -> FrameReport {
    FrameReport {
        address: format!("{:#x}", frame.address),
        function: frame.function.clone(),
        file: frame.file.clone(),
        line: frame.line,
        module: frame.module.clone(),
        module_offset: frame.module_offset.map(|offset| format!("{offset:#x}")),
        build_id: frame.build_id.clone(),
        inlined: frame.inlined,
    }
}

/// Sums stacks that read the same once symbolized: one source line can
/// hold several call sites (an unrolled loop), and users ask "which line".
/// The first of equal stacks (by address) stands for them, so the result
/// does not depend on the order the kernel's map was read in.
fn merge_identical(mut stacks: Vec<StackReport>, table: &FrameTable) -> Vec<StackReport> {
    stacks.sort_by(|a, b| a.addresses.cmp(&b.addresses));
    let mut merged: Vec<StackReport> = Vec::new();
    let mut index = HashMap::new();
    for stack in stacks {
        let identity = (
            stack.allocator.clone(),
            stack.go_type.clone(),
            stack.partial,
            table.identity(&stack.addresses),
        );
        match index.entry(identity) {
            std::collections::hash_map::Entry::Occupied(slot) => {
                let at: usize = *slot.get();
                merged[at].absorb(stack);
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(merged.len());
                merged.push(stack);
            }
        }
    }
    merged
}

/// What a frame is to a reader: (function, file, line), or its address
/// when it has no name.
pub type FrameIdentity = (Option<String>, Option<String>, Option<u32>, String);

pub fn frame_identity(frame: &FrameReport) -> FrameIdentity {
    match frame.function {
        Some(_) => (
            frame.function.clone(),
            frame.file.clone(),
            frame.line,
            String::new(),
        ),
        None => (None, None, None, frame.address.clone()),
    }
}

/// Sums the stacks that share frame 0 (function and file:line; the
/// address when there is no name).
pub fn group_by_caller(stacks: Vec<StackReport>) -> Vec<StackReport> {
    let mut groups: BTreeMap<FrameIdentity, (StackReport, BTreeSet<String>)> = BTreeMap::new();
    for mut stack in stacks {
        let Some(first) = stack.frames.first() else {
            continue;
        };
        let allocator = std::mem::take(&mut stack.allocator);
        match groups.entry(frame_identity(first)) {
            Entry::Occupied(mut group) => {
                let (group, allocators) = group.get_mut();
                if group.go_type != stack.go_type {
                    group.go_type = None;
                }
                group.absorb(stack);
                allocators.insert(allocator);
            }
            Entry::Vacant(slot) => {
                // The first stands for the group: its caller alone.
                stack.frames.truncate(1);
                stack.addresses.clear();
                stack.partial = false;
                slot.insert((stack, BTreeSet::from([allocator])));
            }
        }
    }
    groups
        .into_values()
        .map(|(mut group, allocators)| {
            group.allocator = allocators.into_iter().collect::<Vec<_>>().join(",");
            group
        })
        .collect()
}

/// What Go's runtime passes `mallocgc` no type for: the pointer-free
/// memory it allocates by size (string and byte data, growth of slices
/// without pointers).
pub const UNTYPED: &str = "[untyped]";

/// Sums the stacks that allocated one Go type (the others: one allocator
/// function). Each group keeps the frames of its largest stack.
pub fn group_by_type(stacks: Vec<StackReport>) -> Vec<StackReport> {
    struct Group {
        sum: StackReport,
        allocators: BTreeSet<String>,
        largest: u64,
    }
    let mut groups: BTreeMap<(Option<String>, String), Group> = BTreeMap::new();
    for mut stack in stacks {
        let allocator = std::mem::take(&mut stack.allocator);
        let what = match &stack.go_type {
            Some(go_type) => (Some(go_type.clone()), String::new()),
            None => (None, allocator.clone()),
        };
        match groups.entry(what) {
            Entry::Occupied(mut group) => {
                let group = group.get_mut();
                group.allocators.insert(allocator);
                if stack.rank_bytes() > group.largest {
                    group.largest = stack.rank_bytes();
                    group.sum.frames = std::mem::take(&mut stack.frames);
                    group.sum.addresses = std::mem::take(&mut stack.addresses);
                    group.sum.partial = stack.partial;
                }
                group.sum.absorb(stack);
            }
            Entry::Vacant(slot) => {
                slot.insert(Group {
                    largest: stack.rank_bytes(),
                    sum: stack,
                    allocators: BTreeSet::from([allocator]),
                });
            }
        }
    }
    groups
        .into_values()
        .map(|mut group| {
            group.sum.allocator = group.allocators.into_iter().collect::<Vec<_>>().join(",");
            group.sum
        })
        .collect()
}

/// First by --sort (default: live bytes in live mode, else bytes), then
/// --min-bytes, --top and --depth. `drop_dead`: keep only stacks that
/// still hold blocks (a leak report with --min-age).
pub fn cut(stacks: &mut Vec<StackReport>, options: &ReportOptions, drop_dead: bool) {
    let rank = |stack: &StackReport| -> u64 {
        let live = stack.live.unwrap_or_default();
        match options.sort {
            None => stack.rank_bytes(),
            Some(SortKey::Bytes) => stack.bytes,
            Some(SortKey::Calls) => stack.count,
            Some(SortKey::Live) => live.live_bytes,
            Some(SortKey::Temporary) => live.temporary_count,
            Some(SortKey::Average) => stack.bytes.checked_div(stack.count).unwrap_or(0),
        }
    };
    stacks.sort_by(|a, b| {
        rank(b)
            .cmp(&rank(a))
            .then(b.rank_bytes().cmp(&a.rank_bytes()))
            .then(b.bytes.cmp(&a.bytes))
            .then(b.count.cmp(&a.count))
            .then(a.frames.cmp(&b.frames))
    });
    stacks.retain(|s| s.rank_bytes() >= options.min_bytes.0);
    if drop_dead {
        stacks.retain(|s| s.live.is_some_and(|live| live.live_count > 0));
    }
    stacks.truncate(options.shown_top());
    let depth = options.shown_depth().max(1);
    for stack in stacks {
        stack.frames.truncate(depth);
    }
}

#[cfg(test)]
mod tests {
    use super::operator_new_label;

    #[test]
    fn operator_new_variants_are_named() {
        let label = |f: &str| operator_new_label(f);
        assert_eq!(label("operator new(unsigned long)").as_deref(), Some("new"));
        assert_eq!(
            label("operator new[](unsigned long)").as_deref(),
            Some("new[]")
        );
        assert_eq!(
            label("operator new(unsigned long, std::align_val_t)").as_deref(),
            Some("new(align)")
        );
        assert_eq!(
            label("operator new[](unsigned long, std::nothrow_t const&)").as_deref(),
            Some("new[](nothrow)")
        );
        assert_eq!(
            label("operator new(unsigned long, std::align_val_t, std::nothrow_t const&)")
                .as_deref(),
            Some("new(align, nothrow)")
        );
        assert_eq!(label("operator newline()"), None);
        assert_eq!(label("operator delete(void*)"), None);
        assert_eq!(label("make(int)"), None);
    }
}
