//! Session uprobes (kernel 6.13 and later): a uprobe_multi link whose one
//! program runs at a function's entry and, only when the entry returns 0,
//! at its return. `--live` with sampling uses them on the malloc-like
//! functions so that an unsampled call pays one trap, not a trap and a
//! return trampoline (see `alloc_session` in memprof-ebpf).
//!
//! aya 0.14 has no API for them: its uprobe programs load without an
//! expected attach type, and it cannot make uprobe_multi links. So the
//! program is loaded here from the same object, relocated against the
//! maps aya created (the same kernel maps), and linked with raw `bpf()`
//! calls.
use std::{
    collections::HashSet,
    ffi::CString,
    io,
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd, RawFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use anyhow::{bail, Context as _, Result};
use aya::{maps::Map, Ebpf};

use super::bpf_call::{bpf, bpf_fd};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_PROG_TYPE_TRACING: u32 = 26;
const BPF_TRACE_RAW_TP: u32 = 23;
const BPF_TRACE_UPROBE_SESSION: u32 = 57;

/// `union bpf_attr` for `BPF_PROG_LOAD`, as far as memprof fills it.
#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
    /// The rest of `union bpf_attr`, zeroed as the kernel requires.
    _rest: [u64; 8],
}

/// `union bpf_attr` for `BPF_BTF_GET_FD_BY_ID`.
#[repr(C)]
#[derive(Default)]
struct BtfGetFd {
    btf_id: u32,
    _rest: [u32; 3],
}

/// What a program loaded here is.
pub(super) enum ProgramKind<'a> {
    /// A session uprobe, with its object's type information if it has any.
    Session(Option<Btf<'a>>),
    /// A BTF tracepoint (`fork_hold`): the tracepoint's type in the kernel.
    ForkTracepoint { attach_btf_id: u32 },
}

/// The type information a program's subprograms need (bpf_loop's
/// callbacks cannot load without it).
pub(super) struct Btf<'a> {
    fd: BorrowedFd<'a>,
    function: &'a aya_obj::Function,
}

/// `union bpf_attr` for `BPF_LINK_CREATE` with a uprobe_multi target.
#[repr(C)]
#[derive(Default)]
struct LinkCreateUprobeMulti {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    _pad: u32,
    /// The rest of `union bpf_attr`, zeroed as the kernel requires.
    _rest: [u64; 8],
}

/// Loads instructions as a program of kind `kind`; with the verifier's
/// log in the error when it refuses them.
pub(super) fn load_instructions(
    name: &str,
    instructions: &[aya_obj::generated::bpf_insn],
    kind: ProgramKind,
) -> Result<OwnedFd> {
    let license = CString::new("GPL").expect("no NUL");
    let mut prog_name = [0u8; 16];
    for (to, from) in prog_name.iter_mut().zip(name.bytes().take(15)) {
        *to = from;
    }
    let mut attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: instructions.len() as u32,
        insns: instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type: BPF_TRACE_UPROBE_SESSION,
        ..Default::default()
    };
    let btf = match kind {
        ProgramKind::Session(btf) => btf,
        ProgramKind::ForkTracepoint { attach_btf_id } => {
            attr.prog_type = BPF_PROG_TYPE_TRACING;
            attr.expected_attach_type = BPF_TRACE_RAW_TP;
            attr.attach_btf_id = attach_btf_id;
            None
        }
    };
    if let Some(Btf { fd, function }) = &btf {
        attr.prog_btf_fd = fd.as_raw_fd() as u32;
        let func_info = &function.func_info.func_info;
        if function.func_info_rec_size > 0 {
            attr.func_info_rec_size = function.func_info_rec_size as u32;
            attr.func_info = func_info.as_ptr() as u64;
            attr.func_info_cnt = func_info.len() as u32;
        }
        let line_info = &function.line_info.line_info;
        if function.line_info_rec_size > 0 {
            attr.line_info_rec_size = function.line_info_rec_size as u32;
            attr.line_info = line_info.as_ptr() as u64;
            attr.line_info_cnt = line_info.len() as u32;
        }
    }
    match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(fd),
        Err(err) => {
            // Again, with the verifier's log.
            let mut log = vec![0u8; 16 << 20];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let _ = bpf_fd(BPF_PROG_LOAD, &mut attr);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let log = String::from_utf8_lossy(&log[..end]);
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!("loading BPF program {name}: {err}\n{}", tail.join("\n"))
        }
    }
}

/// Whether this kernel has session uprobes (6.13 and later): it loads a
/// program that only returns 1 with their attach type (kernels before take
/// it: a kprobe program's expected attach type is not checked at load),
/// then links it at "/", as libbpf probes for uprobe_multi: a kernel
/// that knows the attach type refuses the path, not a regular file
/// (EBADF); one that does not refuses the attach type (EINVAL).
pub fn supported() -> bool {
    // r0 = 1; exit
    let instructions = [
        aya_obj::generated::bpf_insn {
            code: 0xb7,
            _bitfield_align_1: [],
            _bitfield_1: aya_obj::generated::bpf_insn::new_bitfield_1(0, 0),
            off: 0,
            imm: 1,
        },
        aya_obj::generated::bpf_insn {
            code: 0x95,
            _bitfield_align_1: [],
            _bitfield_1: aya_obj::generated::bpf_insn::new_bitfield_1(0, 0),
            off: 0,
            imm: 0,
        },
    ];
    let Ok(program) = load_instructions("memprof_probe", &instructions, ProgramKind::Session(None))
    else {
        return false;
    };
    match link(program.as_fd(), Path::new("/"), &[0], &[0], 0) {
        Ok(_) => true,
        Err(err) => err.raw_os_error() == Some(libc::EBADF),
    }
}

/// Loads `alloc_session` and the entry half it tail-calls (through
/// `SESSION_PROGRAMS`) from the BPF object `object`, using the maps
/// `ebpf` (loaded from the same object) created, and the object's type
/// information as aya loaded it for program `loaded`. Call before any map
/// is taken out of `ebpf`.
pub fn load_programs(object: &[u8], ebpf: &Ebpf, loaded: &str) -> Result<OwnedFd> {
    let chosen = load_program(object, ebpf, "alloc_chosen", loaded)?;
    let array = ebpf
        .map("SESSION_PROGRAMS")
        .context("map SESSION_PROGRAMS missing from the object")?;
    set_program(map_fd(array)?, 0, chosen.as_fd()).context("map SESSION_PROGRAMS")?;
    load_program(object, ebpf, "alloc_session", loaded)
}

/// `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`.
#[repr(C)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Puts `program` at `index` of program array `map` (aya's `ProgramArray`
/// takes only programs aya loaded).
fn set_program(map: RawFd, index: u32, program: BorrowedFd<'_>) -> io::Result<()> {
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    let value = program.as_raw_fd() as u32;
    let mut attr = MapUpdate {
        map_fd: map as u32,
        _pad: 0,
        key: &index as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0,
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(drop)
}

/// Loads program `name` of the BPF object `object` as a session uprobe.
fn load_program(object: &[u8], ebpf: &Ebpf, name: &str, loaded: &str) -> Result<OwnedFd> {
    let mut obj = aya_obj::Object::parse(object).context("parsing the BPF object")?;
    // As aya does it (aya's `EbpfLoader::load`).
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    let objects = obj.maps.clone();
    let mut maps = Vec::new();
    for (map_name, map) in ebpf.maps() {
        let object = objects
            .get(map_name)
            .with_context(|| format!("map {map_name} is not in the BPF object"))?;
        maps.push((map_name, map_fd(map)?, object));
    }
    obj.relocate_maps(maps.into_iter(), &text_sections)
        .context("relocating the session program's maps")?;
    obj.relocate_calls(&text_sections)
        .context("relocating the session program's calls")?;
    let program = obj
        .programs
        .get(name)
        .with_context(|| format!("BPF program {name} missing from the object"))?;
    let function = obj
        .functions
        .get(&program.function_key())
        .with_context(|| format!("BPF program {name} has no code"))?;
    let btf = btf_of(ebpf, loaded)?;
    let btf = Btf {
        fd: btf.as_fd(),
        function,
    };
    load_instructions(
        name,
        &function.instructions,
        ProgramKind::Session(Some(btf)),
    )
}

/// The type information (BTF) aya loaded with program `name`.
fn btf_of(ebpf: &Ebpf, name: &str) -> Result<OwnedFd> {
    let program: &aya::programs::UProbe = ebpf
        .program(name)
        .with_context(|| format!("BPF program {name} missing from the object"))?
        .try_into()?;
    let id = program
        .info()?
        .btf_id()
        .with_context(|| format!("BPF program {name} was loaded without BTF"))?;
    let mut attr = BtfGetFd {
        btf_id: id,
        ..Default::default()
    };
    const BPF_BTF_GET_FD_BY_ID: libc::c_long = 19;
    bpf_fd(BPF_BTF_GET_FD_BY_ID, &mut attr).context("BPF_BTF_GET_FD_BY_ID")
}

/// The kernel map behind one of aya's maps (the kinds memprof's object
/// has).
pub(super) fn map_fd(map: &Map) -> Result<RawFd> {
    let data = match map {
        Map::Array(data)
        | Map::PerCpuArray(data)
        | Map::HashMap(data)
        | Map::LruHashMap(data)
        | Map::PerCpuHashMap(data)
        | Map::PerCpuLruHashMap(data)
        | Map::ProgramArray(data)
        | Map::RingBuf(data)
        | Map::StackTraceMap(data)
        | Map::Unsupported(data) => data,
        _ => bail!("a map of a kind the session program cannot use"),
    };
    Ok(data.fd().as_fd().as_raw_fd())
}

/// Links `program` to the functions at `offsets` (file offsets) of the
/// file at `path`, each with its cookie, in process `pid` (its address
/// space, across execs; 0: every process that maps the file). The link
/// lives as long as the returned fd.
pub fn link(
    program: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    pid: u32,
) -> io::Result<OwnedFd> {
    assert_eq!(offsets.len(), cookies.len());
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = LinkCreateUprobeMulti {
        prog_fd: program.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_SESSION,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: offsets.len() as u32,
        pid,
        ..Default::default()
    };
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}
