//! The allocator functions memprof hooks, as data.
//!
//! Adding an allocator function is one row here: the BPF program reads
//! the size (and element count) from the argument registers this table
//! names, and user space attaches one probe per row.

/// Marks an argument slot as unused.
pub const NO_ARG: u8 = u8::MAX;

#[derive(Clone, Copy, Debug)]
pub struct AllocatorSpec {
    /// Symbol name in the library.
    pub name: &'static str,
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
        size_arg,
        count_arg,
        may_nest,
        old_pointer_arg: NO_ARG,
        out_pointer_arg: NO_ARG,
    }
}

/// `spec` for a function that is given a block to resize.
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

/// The malloc family of libc. Order matters only for names: functions
/// that share one address in a library (glibc's aligned_alloc is an alias
/// of memalign) get one probe, named after the first row.
pub const ALLOCATORS: [AllocatorSpec; 9] = [
    spec("malloc", 0, NO_ARG, false),
    spec("calloc", 1, 0, false),
    resizing(spec("realloc", 1, NO_ARG, true)),
    resizing(spec("reallocarray", 2, 1, true)),
    storing(spec("posix_memalign", 2, NO_ARG, true)),
    spec("memalign", 1, NO_ARG, true),
    spec("aligned_alloc", 1, NO_ARG, true),
    spec("valloc", 0, NO_ARG, true),
    spec("pvalloc", 0, NO_ARG, true),
];

/// Row of `malloc` in [`ALLOCATORS`]: the most called allocator by far,
/// it gets a BPF program of its own that needs no cookie lookup.
pub const MALLOC: usize = 0;

/// The release function: frees of blocks are matched against the pointer
/// table in `--live` mode.
pub const FREE: &str = "free";

impl AllocatorSpec {
    /// The cookie of the probe for row `index` of [`ALLOCATORS`].
    pub const fn cookie(&self, index: usize) -> crate::ProbeCookie {
        crate::ProbeCookie {
            allocator: index as u8,
            size_arg: self.size_arg,
            count_arg: self.count_arg,
            may_nest: self.may_nest,
            old_pointer_arg: self.old_pointer_arg,
            out_pointer_arg: self.out_pointer_arg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malloc_row() {
        assert_eq!(ALLOCATORS[MALLOC].name, "malloc");
    }
}
