//! Where kernel struct fields lie, from the kernel's BTF
//! (/sys/kernel/btf/vmlinux): `task_struct.pid` and
//! `linux_binprm.filename`, which the raw sched tracepoint programs read
//! (they get the tracepoints' arguments, not a record with the fields);
//! and the type ids the fork-holding program names (`fork_hold`).
//!
//! Raw tracepoints, because closing the perf event of a classic one waits
//! for an RCU grace period (~80 ms here, one after another): three of them
//! took 0.24 s of every exit. aya parses the same BTF, but its type
//! lookup is not public; these need one pass over the type section,
//! comparing names (8 ms here).
use std::{fs, path::Path};

use anyhow::{bail, Context as _, Result};

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_TYPEDEF: u32 = 8;
const KIND_FUNC: u32 = 12;
/// `enum pid_type`: `signal_struct.pids` is indexed by it.
const PIDTYPE_PGID: u32 = 2;
const SIGTSTP: u32 = 20;

/// Byte offsets of the fields memprof's raw tracepoint programs read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub bprm_filename: u32,
    /// `task_struct.signal` and `signal_struct.live` (the threads left).
    pub task_signal: u32,
    pub signal_live: u32,
    /// A thread's CPU time (`task_struct.se.sum_exec_runtime`) and its
    /// process's reaped threads' (`signal_struct.sum_sched_runtime`).
    pub task_runtime: u32,
    pub signal_runtime: u32,
    /// Whether a parent would see its child stopped (`parent_watch` in
    /// the BPF programs): `task_struct.real_parent` and `__state`; the
    /// process group (`signal_struct.pids[PIDTYPE_PGID]`); the list of
    /// threads blocked in a wait (`signal_struct.wait_chldexit.head`); and
    /// from a waiter's list node back to its flags (`wait_opts.wo_flags`
    /// less `wait_opts.child_wait.entry`).
    pub task_parent: u32,
    pub task_state: u32,
    pub signal_pgrp: u32,
    pub signal_waiters: u32,
    pub waiter_flags_from_node: i32,
}

impl KernelOffsets {
    pub fn of_running_kernel() -> Result<KernelOffsets> {
        let path = Path::new("/sys/kernel/btf/vmlinux");
        let data = fs::read(path).with_context(|| {
            format!(
                "reading {} (memprof needs a kernel with BTF, CONFIG_DEBUG_INFO_BTF)",
                path.display()
            )
        })?;
        Self::of(&data)
    }

    fn of(btf: &[u8]) -> Result<KernelOffsets> {
        let btf = Btf::parse(btf)?;
        Ok(KernelOffsets {
            task_pid: btf.member_offset("task_struct", "pid")?,
            task_tgid: btf.member_offset("task_struct", "tgid")?,
            bprm_filename: btf.member_offset("linux_binprm", "filename")?,
            task_signal: btf.member_offset("task_struct", "signal")?,
            signal_live: btf.member_offset("signal_struct", "live")?,
            task_runtime: btf.member_offset("task_struct", "se")?
                + btf.member_offset("sched_entity", "sum_exec_runtime")?,
            signal_runtime: btf.member_offset("signal_struct", "sum_sched_runtime")?,
            task_parent: btf.member_offset("task_struct", "real_parent")?,
            task_state: btf.member_offset("task_struct", "__state")?,
            signal_pgrp: btf.member_offset("signal_struct", "pids")? + PIDTYPE_PGID * 8,
            signal_waiters: btf.member_offset("signal_struct", "wait_chldexit")?
                + btf.member_offset("wait_queue_head", "head")?,
            waiter_flags_from_node: btf.member_offset("wait_opts", "wo_flags")? as i32
                - btf.member_offset("wait_opts", "child_wait")? as i32
                - btf.member_offset("wait_queue_entry", "entry")? as i32,
        })
    }
}

/// What the fork-holding program (`fork_hold`) names in the kernel: the
/// `task_newtask` tracepoint's type, the kfunc that signals a task, and
/// where a task's process id lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForkHoldTypes {
    pub task_newtask: u32,
    pub send_signal_task: u32,
    pub task_tgid: u32,
    /// `task_struct.sighand`, and in the `sighand_struct` it points to,
    /// the handler of SIGTSTP (`action[SIGTSTP - 1].sa.sa_handler`).
    pub task_sighand: u32,
    pub sigtstp_handler: u32,
}

impl ForkHoldTypes {
    pub fn of_running_kernel() -> Result<ForkHoldTypes> {
        let data = fs::read("/sys/kernel/btf/vmlinux").context("reading the kernel's BTF")?;
        let btf = Btf::parse(&data)?;
        Ok(ForkHoldTypes {
            task_newtask: btf.type_id(KIND_TYPEDEF, "btf_trace_task_newtask")?,
            send_signal_task: btf.type_id(KIND_FUNC, "bpf_send_signal_task")?,
            task_tgid: btf.member_offset("task_struct", "tgid")?,
            task_sighand: btf.member_offset("task_struct", "sighand")?,
            sigtstp_handler: btf.member_offset("sighand_struct", "action")?
                + (SIGTSTP - 1) * btf.struct_size("k_sigaction")?
                + btf.member_offset("k_sigaction", "sa")?
                + btf.member_offset("sigaction", "sa_handler")?,
        })
    }
}

struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Btf<'a>> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != MAGIC {
            bail!("the kernel's BTF is not little-endian BTF");
        }
        let word = |at: usize| u32_at(data, at).unwrap_or(0) as usize;
        let header = word(4);
        let (type_off, type_len, str_off, str_len) = (word(8), word(12), word(16), word(20));
        let section = |off: usize, len: usize| {
            data.get(header + off..header + off + len)
                .context("the kernel's BTF is truncated")
        };
        Ok(Btf {
            types: section(type_off, type_len)?,
            strings: section(str_off, str_len)?,
        })
    }

    fn name(&self, offset: u32) -> &[u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&b| b == 0).unwrap_or(rest.len())]
    }

    /// Each type in order: its id (from 1), name, info word and the
    /// offset of what follows its 12-byte header.
    fn types(&self) -> impl Iterator<Item = Result<(u32, &[u8], u32, usize)>> + '_ {
        let mut at = 0;
        let mut id = 0;
        std::iter::from_fn(move || {
            if at + 12 > self.types.len() {
                return None;
            }
            let header = (|| Ok((u32_at(self.types, at)?, u32_at(self.types, at + 4)?)))();
            let (name, info) = match header {
                Ok(header) => header,
                Err(err) => return Some(Err(err)),
            };
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let Some(extra) = extra_bytes(kind, vlen) else {
                at = self.types.len();
                return Some(Err(anyhow::anyhow!(
                    "the kernel's BTF has a type of unknown kind {kind}"
                )));
            };
            let rest = at + 12;
            at = rest + extra;
            id += 1;
            Some(Ok((id, self.name(name), info, rest)))
        })
    }

    /// The byte offset of `member` in the first struct named `strukt`.
    fn member_offset(&self, strukt: &str, member: &str) -> Result<u32> {
        for entry in self.types() {
            let (_, name, info, members) = entry?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            if kind != KIND_STRUCT || name != strukt.as_bytes() {
                continue;
            }
            for index in 0..vlen {
                let entry = members + index * 12;
                if self.name(u32_at(self.types, entry)?) == member.as_bytes() {
                    let offset = u32_at(self.types, entry + 8)?;
                    // With kind_flag, the low 24 bits are the bit offset.
                    let bits = if info >> 31 == 1 {
                        offset & 0xff_ffff
                    } else {
                        offset
                    };
                    return Ok(bits / 8);
                }
            }
        }
        bail!("the kernel's BTF has no {strukt}.{member}")
    }

    /// The size in bytes of the first struct named `strukt`.
    fn struct_size(&self, strukt: &str) -> Result<u32> {
        let (_, rest) = self.first(KIND_STRUCT, strukt)?;
        // The header's third word.
        u32_at(self.types, rest - 4)
    }

    /// The id of the first type of kind `kind` named `name`.
    fn type_id(&self, kind: u32, name: &str) -> Result<u32> {
        Ok(self.first(kind, name)?.0)
    }

    /// The first type of kind `kind` named `name`: its id, and the offset
    /// of what follows its header.
    fn first(&self, kind: u32, name: &str) -> Result<(u32, usize)> {
        for entry in self.types() {
            let (id, type_name, info, rest) = entry?;
            if (info >> 24) & 0x1f == kind && type_name == name.as_bytes() {
                return Ok((id, rest));
            }
        }
        bail!("the kernel's BTF has no {name}")
    }
}

/// Bytes that follow a type's 12-byte header, by kind.
fn extra_bytes(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        1 | 14 | 17 => 4,                      // int, var, decl_tag
        3 => 12,                               // array
        KIND_STRUCT | KIND_UNION => vlen * 12, // members
        6 | 13 => vlen * 8,                    // enum, func_proto
        15 | 19 => vlen * 12,                  // datasec, enum64
        2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, modifiers, func, float, type_tag
        _ => return None,
    })
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .context("the kernel's BTF is truncated")?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// bpftool's reading of the same BTF (`bits_offset` of the member).
    fn bpftool_offset(strukt: &str, member: &str) -> u32 {
        let dump = std::process::Command::new("bpftool")
            .args([
                "btf",
                "dump",
                "file",
                "/sys/kernel/btf/vmlinux",
                "format",
                "raw",
            ])
            .output()
            .expect("bpftool (scripts/setup.sh installs it)");
        let text = String::from_utf8_lossy(&dump.stdout);
        let start = text
            .find(&format!("STRUCT '{strukt}' "))
            .unwrap_or_else(|| panic!("bpftool lists no struct {strukt}"));
        let line = text[start..]
            .lines()
            .find(|line| line.trim_start().starts_with(&format!("'{member}' ")))
            .unwrap_or_else(|| panic!("bpftool lists no {strukt}.{member}"));
        let bits: u32 = line
            .split("bits_offset=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no bits_offset in {line:?}"));
        bits / 8
    }

    #[test]
    fn finds_the_fields_bpftool_finds() {
        let offsets = KernelOffsets::of_running_kernel().unwrap();
        assert_eq!(offsets.task_pid, bpftool_offset("task_struct", "pid"));
        assert_eq!(offsets.task_tgid, bpftool_offset("task_struct", "tgid"));
        assert_eq!(
            offsets.bprm_filename,
            bpftool_offset("linux_binprm", "filename")
        );
        assert_eq!(offsets.task_signal, bpftool_offset("task_struct", "signal"));
        assert_eq!(offsets.signal_live, bpftool_offset("signal_struct", "live"));
        assert_eq!(
            offsets.task_runtime,
            bpftool_offset("task_struct", "se")
                + bpftool_offset("sched_entity", "sum_exec_runtime")
        );
        assert_eq!(
            offsets.signal_runtime,
            bpftool_offset("signal_struct", "sum_sched_runtime")
        );
        assert_eq!(
            offsets.task_parent,
            bpftool_offset("task_struct", "real_parent")
        );
        assert_eq!(offsets.task_state, bpftool_offset("task_struct", "__state"));
        assert_eq!(
            offsets.signal_pgrp,
            bpftool_offset("signal_struct", "pids") + 16
        );
        assert_eq!(
            offsets.signal_waiters,
            bpftool_offset("signal_struct", "wait_chldexit")
                + bpftool_offset("wait_queue_head", "head")
        );
        assert_eq!(
            offsets.waiter_flags_from_node,
            bpftool_offset("wait_opts", "wo_flags") as i32
                - bpftool_offset("wait_opts", "child_wait") as i32
                - bpftool_offset("wait_queue_entry", "entry") as i32
        );
    }

    /// bpftool's id of a type (`[ID] KIND 'name'`).
    fn bpftool_id(kind: &str, name: &str) -> u32 {
        let dump = std::process::Command::new("bpftool")
            .args(["btf", "dump", "file", "/sys/kernel/btf/vmlinux"])
            .output()
            .expect("bpftool (scripts/setup.sh installs it)");
        let text = String::from_utf8_lossy(&dump.stdout);
        let wanted = format!("] {kind} '{name}' ");
        let line = text
            .lines()
            .find(|line| line.contains(&wanted))
            .unwrap_or_else(|| panic!("bpftool lists no {kind} {name}"));
        line[1..line.find(']').unwrap()].parse().unwrap()
    }

    #[test]
    fn finds_the_types_bpftool_finds() {
        let types = ForkHoldTypes::of_running_kernel().unwrap();
        assert_eq!(
            types.task_newtask,
            bpftool_id("TYPEDEF", "btf_trace_task_newtask")
        );
        assert_eq!(
            types.send_signal_task,
            bpftool_id("FUNC", "bpf_send_signal_task")
        );
        assert_eq!(types.task_tgid, bpftool_offset("task_struct", "tgid"));
        assert_eq!(types.task_sighand, bpftool_offset("task_struct", "sighand"));
        // struct k_sigaction is a struct sigaction (32 bytes here), whose
        // handler comes first.
        assert_eq!(
            types.sigtstp_handler,
            bpftool_offset("sighand_struct", "action") + 19 * 32
        );
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert!(KernelOffsets::of(b"not btf at all, not at all").is_err());
    }
}
