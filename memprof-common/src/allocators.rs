//! The allocator functions memprof hooks, as data.
//!
//! Adding an allocator function is one row here: the BPF program reads
//! the size (and element count) from the argument registers this table
//! names, and user space attaches one probe per row found in a module.
//! Functions named with `--alloc-fn` take rows after these.

/// Marks an argument slot as unused.
pub const NO_ARG: u8 = u8::MAX;

#[derive(Clone, Copy, Debug)]
pub struct AllocatorSpec {
    /// Symbol name in the library.
    pub name: &'static str,
    /// How reports name it: the symbol, or the operator for C++'s
    /// mangled `operator new` symbols.
    pub shown: &'static str,
    /// Argument (0-based) that holds the size in bytes.
    pub size_arg: u8,
    /// Argument that holds an element count multiplied by the size
    /// (calloc, reallocarray), or [`NO_ARG`].
    pub count_arg: u8,
    /// The function may call another hooked allocator internally (glibc's
    /// realloc(NULL, n) jumps to malloc; memalign with a small alignment
    /// calls malloc). Such functions also get a return probe, so that the
    /// inner call is recognised as nested and counted once.
    pub may_nest: bool,
    /// Argument holding a block the call frees or moves (realloc), or
    /// [`NO_ARG`].
    pub old_pointer_arg: u8,
    /// Argument pointing where the call stores the new block's address
    /// (posix_memalign), or [`NO_ARG`]: the new block is the return value.
    pub out_pointer_arg: u8,
}

const fn spec(name: &'static str, size_arg: u8, count_arg: u8, may_nest: bool) -> AllocatorSpec {
    AllocatorSpec {
        name,
        shown: name,
        size_arg,
        count_arg,
        may_nest,
        old_pointer_arg: NO_ARG,
        out_pointer_arg: NO_ARG,
    }
}

/// `spec` for a function that is given a block to resize (argument 0).
const fn resizing(spec: AllocatorSpec) -> AllocatorSpec {
    AllocatorSpec {
        old_pointer_arg: 0,
        ..spec
    }
}

/// `spec` for a function that returns the block through its first argument.
const fn storing(spec: AllocatorSpec) -> AllocatorSpec {
    AllocatorSpec {
        out_pointer_arg: 0,
        ..spec
    }
}

/// A C++ `operator new`: named as people write it, not as it is mangled.
/// It calls malloc (or its replacement's allocator), which counts inside it.
const fn operator(name: &'static str, shown: &'static str) -> AllocatorSpec {
    AllocatorSpec {
        shown,
        ..spec(name, 0, NO_ARG, true)
    }
}

/// Every allocator function memprof knows, by symbol. Order matters only
/// for names: functions that share one address in a library (glibc's
/// aligned_alloc is an alias of memalign; tcmalloc's `tc_malloc` is its
/// `malloc`) get one probe, named after the first row.
///
/// Functions that may call another hooked one (glibc's realloc(NULL, n)
/// jumps to malloc; every operator new calls malloc) are `may_nest`: they
/// get a return probe, so that the inner call counts as nested, once.
pub const ALLOCATORS: [AllocatorSpec; 100] = [
    // The C library's malloc family (also what jemalloc, tcmalloc and
    // mimalloc export when they replace it).
    spec("malloc", 0, NO_ARG, false),
    spec("calloc", 1, 0, false),
    resizing(spec("realloc", 1, NO_ARG, true)),
    resizing(spec("reallocarray", 2, 1, true)),
    storing(spec("posix_memalign", 2, NO_ARG, true)),
    spec("memalign", 1, NO_ARG, true),
    spec("aligned_alloc", 1, NO_ARG, true),
    spec("valloc", 0, NO_ARG, true),
    spec("pvalloc", 0, NO_ARG, true),
    // C++'s replaceable operator new (libstdc++, libc++, or a program's own).
    operator("_Znwm", "new"),
    operator("_Znam", "new[]"),
    operator("_ZnwmRKSt9nothrow_t", "new(nothrow)"),
    operator("_ZnamRKSt9nothrow_t", "new[](nothrow)"),
    operator("_ZnwmSt11align_val_t", "new(align)"),
    operator("_ZnamSt11align_val_t", "new[](align)"),
    operator("_ZnwmSt11align_val_tRKSt9nothrow_t", "new(align, nothrow)"),
    operator(
        "_ZnamSt11align_val_tRKSt9nothrow_t",
        "new[](align, nothrow)",
    ),
    // jemalloc's own API, plain and with the prefixes it is built with
    // (`je_`; `_rjem_` in Rust's tikv-jemallocator).
    spec("mallocx", 0, NO_ARG, false),
    resizing(spec("rallocx", 1, NO_ARG, true)),
    spec("je_malloc", 0, NO_ARG, false),
    spec("je_calloc", 1, 0, false),
    resizing(spec("je_realloc", 1, NO_ARG, true)),
    storing(spec("je_posix_memalign", 2, NO_ARG, true)),
    spec("je_aligned_alloc", 1, NO_ARG, true),
    spec("je_memalign", 1, NO_ARG, true),
    spec("je_valloc", 0, NO_ARG, true),
    spec("je_mallocx", 0, NO_ARG, false),
    resizing(spec("je_rallocx", 1, NO_ARG, true)),
    spec("_rjem_malloc", 0, NO_ARG, false),
    spec("_rjem_calloc", 1, 0, false),
    resizing(spec("_rjem_realloc", 1, NO_ARG, true)),
    storing(spec("_rjem_posix_memalign", 2, NO_ARG, true)),
    spec("_rjem_aligned_alloc", 1, NO_ARG, true),
    spec("_rjem_memalign", 1, NO_ARG, true),
    spec("_rjem_valloc", 0, NO_ARG, true),
    spec("_rjem_mallocx", 0, NO_ARG, false),
    resizing(spec("_rjem_rallocx", 1, NO_ARG, true)),
    // gperftools' tcmalloc (its `tc_` names alias the standard ones).
    spec("tc_malloc", 0, NO_ARG, false),
    spec("tc_malloc_skip_new_handler", 0, NO_ARG, false),
    spec("tc_calloc", 1, 0, false),
    resizing(spec("tc_realloc", 1, NO_ARG, true)),
    storing(spec("tc_posix_memalign", 2, NO_ARG, true)),
    spec("tc_memalign", 1, NO_ARG, true),
    spec("tc_valloc", 0, NO_ARG, true),
    spec("tc_pvalloc", 0, NO_ARG, true),
    operator("tc_new", "new"),
    operator("tc_newarray", "new[]"),
    operator("tc_new_nothrow", "new(nothrow)"),
    operator("tc_newarray_nothrow", "new[](nothrow)"),
    operator("tc_new_aligned", "new(align)"),
    operator("tc_newarray_aligned", "new[](align)"),
    operator("tc_new_aligned_nothrow", "new(align, nothrow)"),
    operator("tc_newarray_aligned_nothrow", "new[](align, nothrow)"),
    // mimalloc's API.
    spec("mi_malloc", 0, NO_ARG, false),
    spec("mi_calloc", 1, 0, true),
    resizing(spec("mi_realloc", 1, NO_ARG, true)),
    spec("mi_zalloc", 0, NO_ARG, true),
    spec("mi_malloc_small", 0, NO_ARG, true),
    spec("mi_zalloc_small", 0, NO_ARG, true),
    spec("mi_mallocn", 1, 0, true),
    resizing(spec("mi_reallocn", 2, 1, true)),
    resizing(spec("mi_reallocf", 1, NO_ARG, true)),
    resizing(spec("mi_reallocarray", 2, 1, true)),
    resizing(spec("mi_recalloc", 2, 1, true)),
    resizing(spec("mi_rezalloc", 1, NO_ARG, true)),
    spec("mi_malloc_aligned", 0, NO_ARG, true),
    spec("mi_malloc_aligned_at", 0, NO_ARG, true),
    spec("mi_zalloc_aligned", 0, NO_ARG, true),
    spec("mi_calloc_aligned", 1, 0, true),
    resizing(spec("mi_realloc_aligned", 1, NO_ARG, true)),
    storing(spec("mi_posix_memalign", 2, NO_ARG, true)),
    spec("mi_memalign", 1, NO_ARG, true),
    spec("mi_aligned_alloc", 1, NO_ARG, true),
    spec("mi_valloc", 0, NO_ARG, true),
    spec("mi_pvalloc", 0, NO_ARG, true),
    spec("mi_heap_malloc", 1, NO_ARG, true),
    spec("mi_heap_zalloc", 1, NO_ARG, true),
    spec("mi_heap_calloc", 2, 1, true),
    spec("mi_heap_mallocn", 2, 1, true),
    spec("mi_heap_malloc_small", 1, NO_ARG, true),
    spec("mi_heap_malloc_aligned", 1, NO_ARG, true),
    AllocatorSpec {
        old_pointer_arg: 1,
        ..spec("mi_heap_realloc", 2, NO_ARG, true)
    },
    operator("mi_new", "new"),
    operator("mi_new_nothrow", "new(nothrow)"),
    operator("mi_new_aligned", "new(align)"),
    operator("mi_new_aligned_nothrow", "new(align, nothrow)"),
    AllocatorSpec {
        count_arg: 0,
        size_arg: 1,
        ..operator("mi_new_n", "new[]")
    },
    resizing(spec("mi_new_realloc", 1, NO_ARG, true)),
    resizing(spec("mi_new_reallocn", 2, 1, true)),
    // glibc's internal names, which a static glibc program may keep alone.
    spec("__libc_malloc", 0, NO_ARG, false),
    spec("__libc_calloc", 1, 0, false),
    resizing(spec("__libc_realloc", 1, NO_ARG, true)),
    spec("__libc_memalign", 1, NO_ARG, true),
    // CPython's object and memory domains: its small objects come from
    // its own allocator (pymalloc), in arenas it maps itself; bigger ones
    // from malloc, and both nest inside. (PyMem_Raw* is malloc.)
    spec("PyObject_Malloc", 0, NO_ARG, true),
    spec("PyObject_Calloc", 1, 0, true),
    resizing(spec("PyObject_Realloc", 1, NO_ARG, true)),
    spec("PyMem_Malloc", 0, NO_ARG, true),
    spec("PyMem_Calloc", 1, 0, true),
    resizing(spec("PyMem_Realloc", 1, NO_ARG, true)),
    // Go's heap: every object the runtime allocates (its arguments in
    // Go's registers; probed at its entry only, see `discover::go`).
    // `mallocgc(size uintptr, typ *_type, needzero bool)`: the type is
    // kept in the call site's key (`sites::GO_TYPE_BITS`).
    spec(GO_MALLOCGC, 0, NO_ARG, false),
];

/// Go's allocator.
pub const GO_MALLOCGC: &str = "runtime.mallocgc";

/// Row of `runtime.mallocgc` in [`ALLOCATORS`].
pub const GO_MALLOCGC_ROW: usize = row_of(GO_MALLOCGC);

/// The row of the allocator named `name` (when compiling).
const fn row_of(name: &str) -> usize {
    let mut row = 0;
    while row < ALLOCATORS.len() {
        let (a, b) = (ALLOCATORS[row].name.as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut at = 0;
            while at < a.len() && a[at] == b[at] {
                at += 1;
            }
            if at == a.len() {
                return row;
            }
        }
        row += 1;
    }
    panic!("no such allocator")
}

/// Row of `malloc` in [`ALLOCATORS`]: the most called allocator by far,
/// it gets a BPF program of its own that needs no cookie lookup.
pub const MALLOC: usize = 0;

/// The release function of the C library: frees of blocks are matched
/// against the pointer table in `--live` mode.
pub const FREE: &str = "free";

/// Functions that release a block, with the argument that holds it. All
/// but `free` itself may call free (libstdc++'s operator delete does): the
/// block they release is not then freed a second time.
pub const RELEASERS: [(&str, u8); 39] = [
    ("free", 0),
    ("cfree", 0),
    ("_ZdlPv", 0),
    ("_ZdaPv", 0),
    ("_ZdlPvm", 0),
    ("_ZdaPvm", 0),
    ("_ZdlPvRKSt9nothrow_t", 0),
    ("_ZdaPvRKSt9nothrow_t", 0),
    ("_ZdlPvSt11align_val_t", 0),
    ("_ZdaPvSt11align_val_t", 0),
    ("_ZdlPvmSt11align_val_t", 0),
    ("_ZdaPvmSt11align_val_t", 0),
    ("_ZdlPvSt11align_val_tRKSt9nothrow_t", 0),
    ("_ZdaPvSt11align_val_tRKSt9nothrow_t", 0),
    ("sdallocx", 0),
    ("dallocx", 0),
    ("je_free", 0),
    ("je_sdallocx", 0),
    ("je_dallocx", 0),
    ("_rjem_free", 0),
    ("_rjem_sdallocx", 0),
    ("_rjem_dallocx", 0),
    ("tc_free", 0),
    ("tc_free_sized", 0),
    ("tc_cfree", 0),
    ("tc_delete", 0),
    ("tc_deletearray", 0),
    ("tc_delete_sized", 0),
    ("tc_delete_nothrow", 0),
    ("tc_delete_aligned", 0),
    ("mi_free", 0),
    ("mi_cfree", 0),
    ("mi_free_size", 0),
    ("mi_free_aligned", 0),
    ("mi_free_size_aligned", 0),
    ("__libc_free", 0),
    ("vfree", 0),
    ("PyObject_Free", 0),
    ("PyMem_Free", 0),
];

/// Whether a function of `ALLOCATORS` or `RELEASERS` is one of CPython's
/// (`--no-python-allocators` leaves them out).
pub fn is_python_allocator(name: &str) -> bool {
    name.starts_with("PyObject_") || name.starts_with("PyMem_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_rows() {
        let python = ALLOCATORS
            .iter()
            .map(|a| a.name)
            .chain(RELEASERS.iter().map(|r| r.0))
            .filter(|name| is_python_allocator(name))
            .count();
        assert_eq!(python, 8);
    }

    #[test]
    fn malloc_row() {
        assert_eq!(ALLOCATORS[MALLOC].name, "malloc");
    }

    #[test]
    fn every_symbol_once_and_room_for_custom_rows() {
        extern crate std;
        let mut names: std::vec::Vec<&str> = ALLOCATORS.iter().map(|a| a.name).collect();
        names.extend(RELEASERS.iter().map(|r| r.0));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        // Cookies hold the row in a byte; --alloc-fn rows follow these.
        assert!(ALLOCATORS.len() < 128);
    }
}
