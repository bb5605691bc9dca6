//! `trace` with session probes: a process that a linked process forks is
//! stopped before its first instruction, until user space has made it
//! session links of its own (`Probes::release_held_forks`). Without the
//! stop, every linked process kept the malloc-like functions' shared
//! entry event, scoped with `inherit` so that its children were probed
//! from their fork: a second uprobe consumer on each of its calls (7-9% of
//! a sampled call, BENCHMARKS.md).
//!
//! The stop is sent from the fork, which runs in the parent, so it needs
//! the `bpf_send_signal_task` kfunc (kernel 6.13 and later;
//! `bpf_send_signal` signals the running task). aya 0.14 cannot relocate a
//! kfunc call, so the program, a BTF tracepoint on `task_newtask`, is
//! assembled here and loaded with raw `bpf()` calls.
use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap, MapData},
    Ebpf,
};
use aya_obj::generated::bpf_insn;
use memprof_common::lost::LostCause;

use super::{
    bpf_call::bpf_fd,
    kernel_types::ForkHoldTypes,
    session_link::{load_instructions, map_fd, ProgramKind},
};

const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const CLONE_THREAD: i32 = 0x10000;
const SIGSTOP: i32 = 19;
const SIGCONT: i32 = 18;
/// `enum pid_type`: the signal goes to the whole process.
const PIDTYPE_TGID: i32 = 1;

/// `HELD_FORKS`'s key while the program is attached (no process has pid
/// 0): the fork tracepoint then leaves `LINKED` to the program.
const HOLDING: u32 = 0;

/// The fork-holding program, attached, and the kernel's `HELD_FORKS`.
pub struct ForkHold {
    link: Option<OwnedFd>,
    _program: OwnedFd,
    held: HashMap<MapData, u32, u64>,
}

impl ForkHold {
    /// Loads and attaches the program, and takes `HELD_FORKS` out of
    /// `ebpf` (call while `LINKED` and `LOST` are still in it).
    pub fn attach(ebpf: &mut Ebpf) -> Result<Self> {
        let types = ForkHoldTypes::of_running_kernel()?;
        // An instruction's offset field holds the field's offset.
        for (field, offset) in [
            ("task_struct.tgid", types.task_tgid),
            ("task_struct.sighand", types.task_sighand),
            ("SIGTSTP's handler", types.sigtstp_handler),
        ] {
            anyhow::ensure!(
                i16::try_from(offset).is_ok(),
                "{field} lies too far ({offset} bytes) for the fork-holding program"
            );
        }
        let fd = |name: &str| -> Result<RawFd> {
            map_fd(ebpf.map(name).with_context(|| format!("map {name}"))?)
        };
        let instructions = program(&types, fd("LINKED")?, fd("HELD_FORKS")?, fd("LOST")?);
        let program = load_instructions(
            "memprof_hold",
            &instructions,
            ProgramKind::ForkTracepoint {
                attach_btf_id: types.task_newtask,
            },
        )?;
        #[repr(C)]
        #[derive(Default)]
        struct RawTracepointOpen {
            name: u64,
            prog_fd: u32,
            _pad: u32,
            _rest: [u64; 4],
        }
        let mut attr = RawTracepointOpen {
            prog_fd: program.as_raw_fd() as u32,
            ..Default::default()
        };
        let link = bpf_fd(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
            .context("attaching the fork-holding program to task_newtask")?;
        let held = ebpf.take_map("HELD_FORKS").context("map HELD_FORKS")?;
        let mut held = HashMap::try_from(held)?;
        held.insert(HOLDING, 0, 0).context("map HELD_FORKS")?;
        Ok(ForkHold {
            link: Some(link),
            _program: program,
            held,
        })
    }

    /// The processes held now, each with its parent's linked groups.
    pub fn held(&self) -> Vec<(u32, u64)> {
        self.held
            .iter()
            .filter_map(Result::ok)
            .filter(|&(pid, _)| pid != HOLDING)
            .collect()
    }

    /// Whether forks are still held (not once the profile ends).
    pub fn holding(&self) -> bool {
        self.link.is_some()
    }

    /// Lets held process `child` run, then takes it out of the map (see
    /// `unlist`).
    pub fn release(&mut self, child: u32) {
        // SAFETY: sends a signal, nothing else.
        unsafe { libc::kill(child as i32, libc::SIGCONT) };
        self.unlist(child);
    }

    /// Takes held process `child` out of the map once it was let run
    /// (`stopped_parents` may have its parent continue it). Not before:
    /// memprof stopped or killed in between would leave it stopped where
    /// the watchdog does not look. A process that took its pid meanwhile
    /// is not held in its place (the program enters none over an entry).
    pub fn unlist(&mut self, child: u32) {
        let _ = self.held.remove(&child);
    }

    /// Holds no more process (those held still wait for `release`). A
    /// program run under way as the link closes still ends: it takes
    /// microseconds, waited for here.
    pub fn detach(&mut self) {
        if self.link.take().is_some() {
            std::thread::sleep(std::time::Duration::from_millis(5));
            let _ = self.held.remove(&HOLDING);
        }
    }
}

/// Never leaves a process stopped (memprof ending on an error, say).
impl Drop for ForkHold {
    fn drop(&mut self) {
        self.detach();
        for (child, _) in self.held() {
            self.release(child);
        }
    }
}

/// The instructions (see the comments in `program`).
#[derive(Clone, Copy)]
enum Step {
    Insn(bpf_insn),
    /// A map's fd in a 64-bit load (two slots).
    LoadMap(u8, RawFd),
    /// A conditional jump on `reg` against `imm` to a label.
    JumpIf(u8, Condition, i32, Label),
    Mark(Label),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Label {
    Enter,
    Lost,
    Out,
}

#[derive(Clone, Copy)]
enum Condition {
    Equal,
    NotEqual,
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Step {
    Step::Insn(raw(code, dst, src, off, imm))
}

fn raw(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> bpf_insn {
    bpf_insn {
        code,
        _bitfield_align_1: [],
        _bitfield_1: bpf_insn::new_bitfield_1(dst, src),
        off,
        imm,
    }
}

// The eBPF instruction classes and modes used below.
const MOV_IMM: u8 = 0xb7;
const MOV_REG: u8 = 0xbf;
const ADD_IMM: u8 = 0x07;
const AND_IMM: u8 = 0x57;
const RSH_IMM: u8 = 0x77;
const LOAD_DW: u8 = 0x79;
const LOAD_W: u8 = 0x61;
const STORE_DW: u8 = 0x7b;
const STORE_W: u8 = 0x63;
const STORE_W_IMM: u8 = 0x62;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const JEQ_IMM: u8 = 0x15;
const JNE_IMM: u8 = 0x55;
const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;
const PSEUDO_KFUNC_CALL: u8 = 2;
const HELPER_MAP_LOOKUP: i32 = 1;
const HELPER_MAP_UPDATE: i32 = 2;
const HELPER_MAP_DELETE: i32 = 3;
const HELPER_PID_TGID: i32 = 14;
/// `bpf_map_update_elem`'s flag: only a new key.
const BPF_NOEXIST: i32 = 1;
const R0: u8 = 0;
const R1: u8 = 1;
const R2: u8 = 2;
const R3: u8 = 3;
const R4: u8 = 4;
const R6: u8 = 6;
const R7: u8 = 7;
const R8: u8 = 8;
const R9: u8 = 9;
const FP: u8 = 10;
/// A signal's handler that ignores it.
const SIG_IGN: i32 = 1;

/// `task_newtask(task, clone_flags)`, in the parent. A new process (not a
/// thread) loses the `LINKED` entry a dead process with its id may have
/// left (the fork tracepoint, later, does not touch it while forks are
/// held: user space may have linked the child by then). If its parent has
/// session links it is stopped, then entered in `HELD_FORKS` with the
/// parent's groups. One that cannot be stopped, or entered (then let go),
/// runs unprobed: counted lost.
///
/// Not stopped, but entered (so that user space links it all the same),
/// and counted lost as it runs unprobed until then: the child of a parent
/// that ignores SIGTSTP, as a job-control shell does. At the fork the
/// child is still in the shell's process group and the shell is not
/// waiting yet (`parent_watch` cannot tell), but the shell waits for its
/// job with `WUNTRACED` a moment later: it took the stop for the user's,
/// printed "Stopped" and left the job stopped.
fn program(types: &ForkHoldTypes, linked: RawFd, held: RawFd, lost: RawFd) -> Vec<bpf_insn> {
    use Condition::*;
    use Label::*;
    let steps = [
        &[
            // r6 = the tracepoint's arguments: [task, clone_flags].
            insn(MOV_REG, R6, R1, 0, 0),
            insn(LOAD_DW, R7, R6, 8, 0),
            insn(AND_IMM, R7, 0, 0, CLONE_THREAD),
            Step::JumpIf(R7, NotEqual, 0, Out),
            // r8 = the task; its tgid at -8.
            insn(LOAD_DW, R8, R6, 0, 0),
            Step::JumpIf(R8, Equal, 0, Out),
            insn(LOAD_W, R2, R8, types.task_tgid as i16, 0),
            insn(STORE_W, FP, R2, -8, 0),
            Step::LoadMap(R1, linked),
            insn(MOV_REG, R2, FP, 0, 0),
            insn(ADD_IMM, R2, 0, 0, -8),
            insn(CALL, 0, 0, 0, HELPER_MAP_DELETE),
            // The parent's groups, if it is linked, at -16.
            insn(CALL, 0, 0, 0, HELPER_PID_TGID),
            insn(RSH_IMM, R0, 0, 0, 32),
            insn(STORE_W, FP, R0, -4, 0),
        ][..],
        &lookup(linked, -4),
        &[
            insn(LOAD_DW, R7, R0, 0, 0),
            insn(STORE_DW, FP, R7, -16, 0),
            // r9 = 1 where the child is not stopped: its parent ignores
            // SIGTSTP (the child's handlers are a copy of the parent's).
            insn(MOV_IMM, R9, 0, 0, 1),
            insn(LOAD_DW, R1, R8, types.task_sighand as i16, 0),
            insn(LOAD_DW, R1, R1, types.sigtstp_handler as i16, 0),
            Step::JumpIf(R1, Equal, SIG_IGN, Enter),
            insn(MOV_IMM, R9, 0, 0, 0),
            // Stopped first (the stop is queued, and lands within
            // microseconds; user space acts on the entry a millisecond
            // later at best): a stop landing after user space let it go
            // would never be undone.
            insn(MOV_REG, R1, R8, 0, 0),
            insn(MOV_IMM, R2, 0, 0, SIGSTOP),
        ][..],
        &signal(types.send_signal_task),
        &[
            Step::JumpIf(R0, NotEqual, 0, Lost),
            // HELD_FORKS[child's tgid] = the groups.
            Step::Mark(Enter),
            Step::LoadMap(R1, held),
            insn(MOV_REG, R2, FP, 0, 0),
            insn(ADD_IMM, R2, 0, 0, -8),
            insn(MOV_REG, R3, FP, 0, 0),
            insn(ADD_IMM, R3, 0, 0, -16),
            insn(MOV_IMM, R4, 0, 0, BPF_NOEXIST),
            insn(CALL, 0, 0, 0, HELPER_MAP_UPDATE),
            // Entered and not stopped: it runs unprobed until linked.
            Step::JumpIf(R9, NotEqual, 0, Lost),
            Step::JumpIf(R0, Equal, 0, Out),
            // Not entered (4,096 held at once, or a process with its pid
            // let go and not yet unlisted): nothing would let it go.
            // SIGCONT cancels the stop.
            insn(MOV_REG, R1, R8, 0, 0),
            insn(MOV_IMM, R2, 0, 0, SIGCONT),
        ],
        &signal(types.send_signal_task),
        &[
            // LOST[ForkUnheld] += 1 (this CPU's).
            Step::Mark(Lost),
            insn(STORE_W_IMM, FP, 0, -4, LostCause::ForkUnheld as i32),
        ],
        &lookup(lost, -4),
        &[
            insn(LOAD_DW, R1, R0, 0, 0),
            insn(ADD_IMM, R1, 0, 0, 1),
            insn(STORE_DW, R0, R1, 0, 0),
            Step::Mark(Out),
            insn(MOV_IMM, R0, 0, 0, 0),
            insn(EXIT, 0, 0, 0, 0),
        ],
    ]
    .concat();
    assemble(&steps)
}

/// bpf_send_signal_task(r1: the task, r2: the signal, PIDTYPE_TGID, 0),
/// the kfunc of BTF id `send_signal_task`.
fn signal(send_signal_task: u32) -> [Step; 3] {
    [
        insn(MOV_IMM, R3, 0, 0, PIDTYPE_TGID),
        insn(MOV_IMM, R4, 0, 0, 0),
        insn(CALL, 0, PSEUDO_KFUNC_CALL, 0, send_signal_task as i32),
    ]
}

/// r0 = the value at the key on the stack at `key` in `map`; to `Out`
/// if there is none.
fn lookup(map: RawFd, key: i16) -> [Step; 5] {
    [
        Step::LoadMap(R1, map),
        insn(MOV_REG, R2, FP, 0, 0),
        insn(ADD_IMM, R2, 0, 0, key.into()),
        insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP),
        Step::JumpIf(R0, Condition::Equal, 0, Label::Out),
    ]
}

/// The steps as instructions, labels resolved.
fn assemble(steps: &[Step]) -> Vec<bpf_insn> {
    let size = |step: &Step| match step {
        Step::LoadMap(..) => 2,
        Step::Mark(_) => 0,
        _ => 1,
    };
    let mut at = Vec::with_capacity(steps.len());
    let mut slot = 0i32;
    for step in steps {
        at.push(slot);
        slot += size(step);
    }
    let label_at = |label: Label| {
        steps
            .iter()
            .zip(&at)
            .find(|(step, _)| matches!(step, Step::Mark(l) if *l == label))
            .map(|(_, &slot)| slot)
            .expect("every label is marked")
    };
    let mut out = Vec::new();
    for (step, &slot) in steps.iter().zip(&at) {
        let jump = |label| (label_at(label) - slot - 1) as i16;
        let one = match *step {
            Step::Insn(insn) => insn,
            Step::LoadMap(reg, fd) => {
                out.push(raw(LD_IMM64, reg, PSEUDO_MAP_FD, 0, fd));
                raw(0, 0, 0, 0, 0)
            }
            Step::JumpIf(reg, condition, imm, label) => {
                let code = match condition {
                    Condition::Equal => JEQ_IMM,
                    Condition::NotEqual => JNE_IMM,
                };
                raw(code, reg, 0, jump(label), imm)
            }
            Step::Mark(_) => continue,
        };
        out.push(one);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_their_labels_past_two_slot_loads() {
        let steps = [
            Step::JumpIf(R1, Condition::Equal, 0, Label::Out),
            Step::LoadMap(R1, 7),
            Step::JumpIf(R0, Condition::NotEqual, 0, Label::Lost),
            Step::Mark(Label::Lost),
            insn(MOV_IMM, R0, 0, 0, 1),
            Step::Mark(Label::Out),
            insn(EXIT, 0, 0, 0, 0),
        ];
        let code = assemble(&steps);
        assert_eq!(code.len(), 6);
        // The jump at 0 lands on the exit at 5; the one at 3 on 4.
        assert_eq!((code[0].code, code[0].off), (JEQ_IMM, 4));
        assert_eq!(
            (code[1].code, code[1].src_reg(), code[1].imm),
            (LD_IMM64, 1, 7)
        );
        assert_eq!((code[3].code, code[3].off), (JNE_IMM, 0));
        assert_eq!(code[5].code, EXIT);
    }

    /// A map for the program to name (`BPF_MAP_CREATE`, u32 keys).
    fn create_map(map_type: u32, value_size: u32, max_entries: u32) -> OwnedFd {
        #[repr(C)]
        #[derive(Default)]
        struct MapCreate {
            map_type: u32,
            key_size: u32,
            value_size: u32,
            max_entries: u32,
            _rest: [u64; 12],
        }
        let mut attr = MapCreate {
            map_type,
            key_size: 4,
            value_size,
            max_entries,
            ..Default::default()
        };
        bpf_fd(0, &mut attr).expect("BPF_MAP_CREATE (run as root)")
    }

    /// The kernel's verifier takes the program (it refuses a kfunc call
    /// it cannot resolve, an unchecked pointer or a wrong field offset).
    #[test]
    fn the_verifier_takes_the_program() {
        const HASH: u32 = 1;
        const PER_CPU_ARRAY: u32 = 6;
        let types = ForkHoldTypes::of_running_kernel().unwrap();
        let linked = create_map(HASH, 8, 4);
        let held = create_map(HASH, 8, 4);
        let lost = create_map(PER_CPU_ARRAY, 8, LostCause::COUNT);
        let instructions = program(
            &types,
            linked.as_raw_fd(),
            held.as_raw_fd(),
            lost.as_raw_fd(),
        );
        // As many as docs/decisions/0025-fork-holding-in-trace.md says.
        assert_eq!(instructions.len(), 62);
        load_instructions(
            "memprof_hold",
            &instructions,
            ProgramKind::ForkTracepoint {
                attach_btf_id: types.task_newtask,
            },
        )
        .unwrap();
    }
}
