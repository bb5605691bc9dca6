//! Programs that sample their own allocations and say so through USDT
//! probes (`.note.stapsdt`): the OpenTelemetry contract, provider
//! `otel_memory`, `alloc(ptr, size, weight)` on sampled allocations only
//! (`weight`: the unbiased bytes the sample stands for) and `free(ptr)` on
//! sampled pointers only; and Datadog's heap sampler (`ddheap`), which
//! emits the same probes. Where a probe's arguments are is written in its
//! note (`8@%rdi`, `-4@-20(%rbp)`, `8@$64`): user space decodes it into a
//! [`UsdtSpec`] the BPF program follows.

/// The providers memprof knows, as call-site "allocators" (`AllocKey::
/// allocator`), past the direct mappings' ids.
pub const OTEL_MEMORY: u32 = 0x200;
pub const DDHEAP: u32 = 0x201;

/// Provider names, by allocator id from [`OTEL_MEMORY`].
pub const PROVIDERS: [&str; 2] = ["otel_memory", "ddheap"];

/// How reports name the calls of `allocator`, if it is a USDT provider's.
pub fn provider_name(allocator: u32) -> Option<&'static str> {
    PROVIDERS
        .get(allocator.checked_sub(OTEL_MEMORY)? as usize)
        .copied()
}

/// Where one argument is.
pub mod arg {
    /// No such argument: reads as 0.
    pub const NONE: u8 = 0;
    /// In a register.
    pub const REGISTER: u8 = 1;
    /// In memory at register + offset.
    pub const MEMORY: u8 = 2;
    /// A constant.
    pub const CONSTANT: u8 = 3;
    /// In memory at register + index register * scale + offset
    /// (`UsdtArg::index`, `UsdtArg::scale`).
    pub const MEMORY_INDEXED: u8 = 4;
}

/// One argument of a USDT probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtArg {
    /// [`arg`]'s kinds.
    pub kind: u8,
    /// The register, as its index among x86-64 `pt_regs`' 8-byte fields
    /// (r15 = 0 ... rdi = 14, rip = 16, rsp = 19).
    pub register: u8,
    /// Bytes (1, 2, 4, 8); negative when signed.
    pub size: i8,
    /// [`arg::MEMORY_INDEXED`]: the index register, and its scale.
    pub index: u8,
    pub scale: u8,
    pub reserved: [u8; 3],
    /// The memory offset, or the constant.
    pub value: i64,
}

/// A USDT probe's arguments (the first three: `alloc` has three, `free`
/// one), and the provider.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsdtSpec {
    /// [`OTEL_MEMORY`] or [`DDHEAP`].
    pub allocator: u32,
    pub reserved: u32,
    pub args: [UsdtArg; 3],
}

/// Probes whose specs the kernel's table holds.
pub const USDT_SPECS: u32 = 256;

/// `pt_regs` field index of an x86-64 register named as in an arg spec
/// (any width: `rdi`, `edi`, `di`, `dil`; `r8`, `r8d`, `r8w`, `r8b`).
pub fn register_index(name: &str) -> Option<u8> {
    const LEGACY: [([&str; 4], u8); 8] = [
        (["rax", "eax", "ax", "al"], 10),
        (["rbx", "ebx", "bx", "bl"], 5),
        (["rcx", "ecx", "cx", "cl"], 11),
        (["rdx", "edx", "dx", "dl"], 12),
        (["rsi", "esi", "si", "sil"], 13),
        (["rdi", "edi", "di", "dil"], 14),
        (["rbp", "ebp", "bp", "bpl"], 4),
        (["rsp", "esp", "sp", "spl"], 19),
    ];
    if let Some((_, index)) = LEGACY.iter().find(|(names, _)| names.contains(&name)) {
        return Some(*index);
    }
    if name == "rip" {
        return Some(16);
    }
    // r8..r15, with a d/w/b suffix for narrower widths.
    let number: u8 = name
        .strip_prefix('r')?
        .trim_end_matches(['d', 'w', 'b'])
        .parse()
        .ok()?;
    // pt_regs: r15, r14, r13, r12, rbp, rbx, r11, r10, r9, r8, ...
    match number {
        12..=15 => Some(15 - number),
        8..=11 => Some(17 - number),
        _ => None,
    }
}
