//! Where in a function to put its uprobe. A uprobe on an instruction the
//! kernel emulates (push, jmp, jcc, call, some nops) costs one trap; on
//! anything else the kernel must also single-step the instruction out of
//! line, a second trap (measured here: ~1.4 µs against ~6 µs). glibc's
//! `free` starts with `test %rdi,%rdi`, CET-built code with `endbr64`.
//!
//! So the probe may move to the first emulated instruction, when skipping
//! the ones before it cannot change what the BPF program reads, and no
//! branch in the library (the function itself or any other code) lands on
//! the skipped bytes or on the new spot (the probe would then fire on
//! paths that never entered the function).
use std::collections::HashSet;

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};
use memprof_common::allocators::NO_ARG;

/// At most this many instructions are skipped.
const MAX_SKIPPED: usize = 4;

/// The registers that pass a function's arguments, in order (System V).
const ARGUMENT_REGISTERS: [Register; 6] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// What the programs on a probe read when it fires.
#[derive(Clone, Copy, Debug)]
pub struct ProbeReads {
    /// The arguments read: bit `n` for argument `n` (0-based).
    pub arguments: u8,
    /// The frame pointer, where the stack walk starts.
    pub frame_pointer: bool,
    /// The stack pointer and the return address at it: allocator probes
    /// read the caller there, and a return probe replaces it.
    pub stack: bool,
}

impl ProbeReads {
    /// An allocator's entry (and return) probe: the arguments `args`
    /// (`NO_ARG` entries left out), the frame pointer for the stack walk,
    /// the return address at the stack pointer. None when an argument is
    /// past the registers: such a function is probed at byte 0.
    pub fn allocator(args: &[u8]) -> Option<ProbeReads> {
        let mut arguments = 0u8;
        for &arg in args.iter().filter(|&&arg| arg != NO_ARG) {
            if usize::from(arg) >= ARGUMENT_REGISTERS.len() {
                return None;
            }
            arguments |= 1 << arg;
        }
        Some(ProbeReads {
            arguments,
            frame_pointer: true,
            stack: true,
        })
    }

    /// Whether the probe reads `register` (a full 64-bit one).
    fn reads(&self, register: Register) -> bool {
        let argument = ARGUMENT_REGISTERS
            .iter()
            .position(|&r| r == register)
            .is_some_and(|n| self.arguments & (1 << n) != 0);
        argument
            || (self.frame_pointer && register == Register::RBP)
            || (self.stack && register == Register::RSP)
    }
}

/// free's (and every release function's) probe: its argument, and the
/// stack pointer with the return address at it (which code called it;
/// whether it runs inside operator delete).
pub fn release_reads(ptr_arg: u8) -> Option<ProbeReads> {
    ProbeReads::allocator(&[ptr_arg]).map(|reads| ProbeReads {
        frame_pointer: false,
        ..reads
    })
}

/// The offset from the function's start where its probe goes: that of the
/// first instruction the kernel emulates if it is safe to skip to it, else
/// 0. `code` is the whole function, `address` its virtual address;
/// `targets` are the direct branch targets of all the code that could jump
/// into it (see `branch_targets`).
pub fn probe_offset(code: &[u8], address: u64, reads: ProbeReads, targets: &HashSet<u64>) -> u64 {
    let Some(candidate) = first_emulated(code, address, reads) else {
        return 0;
    };
    let jumped_into =
        (1..=candidate).any(|skipped| targets.contains(&address.wrapping_add(skipped)));
    if jumped_into {
        return 0;
    }
    candidate
}

/// The offset of the `jbe` closing the stack check a Go function's
/// prologue opens with (`cmp rsp, [r14+16]`, or `lea r12, [rsp-N]` then
/// `cmp r12, [r14+16]`), which jumps to code that grows the stack and
/// enters the function again from its first byte. A probe there costs
/// one trap (the kernel emulates a `jcc`) and sees from the flags which
/// way it goes. None for a function without one (a leaf that never
/// grows its stack).
pub fn go_stack_check(code: &[u8], address: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut compared = false;
    for _ in 0..3 {
        if !decoder.can_decode() {
            break;
        }
        let instruction = decoder.decode();
        match instruction.mnemonic() {
            // g, Go's goroutine, is in R14; its stack bound at +16.
            Mnemonic::Cmp if instruction.memory_base() == Register::R14 => compared = true,
            Mnemonic::Lea if !compared && instruction.memory_base() == Register::RSP => {}
            Mnemonic::Jbe if compared => return Some(instruction.ip().wrapping_sub(address)),
            _ => break,
        }
    }
    None
}

/// The offset of the first emulated instruction, if every instruction
/// before it is safe to skip.
fn first_emulated(code: &[u8], address: u64, reads: ProbeReads) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut instruction = Instruction::default();
    for _ in 0..=MAX_SKIPPED {
        if !decoder.can_decode() {
            return None;
        }
        decoder.decode_out(&mut instruction);
        if instruction.is_invalid() {
            return None;
        }
        if is_emulated(&instruction) {
            return Some(instruction.ip().wrapping_sub(address));
        }
        if !safe_to_skip(&instruction, &mut info, reads) {
            return None;
        }
    }
    None
}

/// The instructions the x86 uprobe code emulates instead of single-stepping
/// (arch/x86/kernel/uprobes.c: branch_setup_xol_ops and push emulation).
fn is_emulated(instruction: &Instruction) -> bool {
    match instruction.flow_control() {
        FlowControl::UnconditionalBranch | FlowControl::Call => matches!(
            instruction.code(),
            Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64
        ),
        FlowControl::ConditionalBranch => instruction.is_jcc_short_or_near(),
        FlowControl::Next => {
            let push_register = instruction.mnemonic() == Mnemonic::Push
                && instruction.op0_kind() == OpKind::Register
                && instruction.op0_register().is_gpr64();
            // The one-byte nop and the five-byte nop (measured cheap).
            let nop = instruction.mnemonic() == Mnemonic::Nop && matches!(instruction.len(), 1 | 5);
            push_register || nop
        }
        _ => false,
    }
}

/// True when running `instruction` or not makes no difference to the
/// probe: it does not branch, writes no memory, leaves the stack pointer
/// alone (when read) and writes none of the registers the program reads.
fn safe_to_skip(
    instruction: &Instruction,
    info: &mut InstructionInfoFactory,
    reads: ProbeReads,
) -> bool {
    if instruction.flow_control() != FlowControl::Next {
        return false;
    }
    let info = info.info(instruction);
    if info.used_memory().iter().any(|m| writes(m.access())) {
        return false;
    }
    info.used_registers()
        .iter()
        .all(|used| !(reads.reads(used.register().full_register()) && writes(used.access())))
}

fn writes(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// The targets of every direct branch and call in `code` (a whole
/// executable section at `address`): to check that no code outside a
/// function (a `.cold` part, another function) jumps into the bytes its
/// probe skips. Decoding a section straight through can lose step on
/// padding or data; a false target only keeps a probe at offset 0.
pub fn branch_targets(code: &[u8], address: u64) -> HashSet<u64> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut targets = HashSet::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        if matches!(
            instruction.op0_kind(),
            OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
        ) {
            targets.insert(instruction.near_branch_target());
        }
    }
    targets
}

/// Where a function's code (`code`, at `address`) jumps out of itself:
/// its tail calls (jemalloc's `malloc` ends in `jmp malloc_default`).
/// The function's work goes on there with no frame of its own left.
pub fn tail_call_targets(code: &[u8], address: u64) -> Vec<u64> {
    let end = address + code.len() as u64;
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    let mut targets = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instruction);
        let jump = matches!(
            instruction.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
        );
        if jump
            && matches!(
                instruction.op0_kind(),
                OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
            )
        {
            let target = instruction.near_branch_target();
            if !(address..end).contains(&target) && !targets.contains(&target) {
                targets.push(target);
            }
        }
    }
    targets
}

/// The GOT slot a PLT stub (`code`, at `address`) jumps through: its
/// first `jmp *slot(%rip)`.
pub fn plt_slot(code: &[u8], address: u64) -> Option<u64> {
    let mut decoder = Decoder::with_ip(64, code, address, DecoderOptions::NONE);
    let mut instruction = Instruction::default();
    for _ in 0..3 {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut instruction);
        if instruction.flow_control() == FlowControl::IndirectBranch
            && instruction.is_ip_rel_memory_operand()
        {
            return Some(instruction.ip_rel_memory_address());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_probes_go_on_the_stack_checks_branch() {
        // runtime.mallocgc (go1.19): cmp 0x10(%r14),%rsp; jbe; sub $0x70,%rsp
        let mallocgc = [
            0x49, 0x3b, 0x66, 0x10, 0x0f, 0x86, 0xbe, 0x08, 0x00, 0x00, 0x48, 0x83, 0xec, 0x70,
        ];
        assert_eq!(go_stack_check(&mallocgc, AT), Some(4));
        // runtime.chanrecv: lea -0x8(%rsp),%r12; cmp 0x10(%r14),%r12; jbe
        let chanrecv = [
            0x4c, 0x8d, 0x64, 0x24, 0xf8, 0x4d, 0x3b, 0x66, 0x10, 0x0f, 0x86, 0x2a, 0x05, 0x00,
            0x00,
        ];
        assert_eq!(go_stack_check(&chanrecv, AT), Some(9));
        // No check (sub $0x18,%rsp), or a check against another register.
        assert_eq!(go_stack_check(&[0x48, 0x83, 0xec, 0x18], AT), None);
        let other = [0x48, 0x3b, 0x61, 0x10, 0x0f, 0x86, 0x10, 0x00, 0x00, 0x00];
        assert_eq!(go_stack_check(&other, AT), None);
    }

    const AT: u64 = 0x1000;
    /// A probe that reads the first three arguments (calloc, realloc).
    const ALLOCATOR_READS: ProbeReads = ProbeReads {
        arguments: 0b111,
        frame_pointer: true,
        stack: true,
    };
    const FREE_READS: ProbeReads = ProbeReads {
        arguments: 0b1,
        frame_pointer: false,
        stack: true,
    };

    /// The offset for a function that only itself could jump into.
    fn offset(code: &[u8], reads: ProbeReads) -> u64 {
        probe_offset(code, AT, reads, &branch_targets(code, AT))
    }

    #[test]
    fn tail_calls_are_jumps_out_of_the_function() {
        // test %rdi,%rdi; je +1 (inside); ret; jmp +0x100 (out)
        let code = [
            0x48, 0x85, 0xff, 0x74, 0x01, 0xc3, 0xe9, 0x00, 0x01, 0x00, 0x00,
        ];
        assert_eq!(tail_call_targets(&code, AT), [AT + 11 + 0x100]);
    }

    #[test]
    fn a_plt_stub_jumps_through_its_got_slot() {
        // endbr64; bnd jmp *0x2fe2(%rip)
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xe2, 0x2f, 0x00, 0x00,
        ];
        assert_eq!(plt_slot(&code, AT), Some(AT + 11 + 0x2fe2));
        assert_eq!(plt_slot(&[0xc3], AT), None);
    }

    #[test]
    fn skips_a_test_to_the_emulated_branch() {
        // test %rdi,%rdi; je +3; push %rbp; ret
        let code = [0x48, 0x85, 0xff, 0x74, 0x02, 0x55, 0xc3, 0xc3];
        assert_eq!(offset(&code, FREE_READS), 3);
    }

    #[test]
    fn stays_at_zero_on_an_emulated_first_instruction() {
        // push %r12; mov %rdi,%rbx
        let code = [0x41, 0x54, 0x48, 0x89, 0xfb];
        assert_eq!(offset(&code, ALLOCATOR_READS), 0);
    }

    #[test]
    fn skips_endbr64_and_a_flag_only_compare() {
        // endbr64; cmpb $0,0x10(%rip); push %rbx
        let code = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x00, 0x53,
        ];
        assert_eq!(offset(&code, ALLOCATOR_READS), 11);
    }

    #[test]
    fn a_branch_into_the_skipped_bytes_keeps_offset_zero() {
        // 0: test %rdi,%rdi; 3: je +3 (to 8); 5: push %rbp; 6: jmp -5 (to 3); 8: ret
        let code = [0x48, 0x85, 0xff, 0x74, 0x03, 0x55, 0xeb, 0xfb, 0xc3];
        assert_eq!(offset(&code, FREE_READS), 0);
    }

    #[test]
    fn a_write_to_a_read_register_keeps_offset_zero() {
        // mov %rax,%rdi; push %rbp
        let code = [0x48, 0x89, 0xc7, 0x55];
        assert_eq!(offset(&code, FREE_READS), 0);
        // glibc's reallocarray: mov %rsi,%rax; mul %rdx (writes rdx); ...
        let code = [
            0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6, 0x70, 0x05,
        ];
        assert_eq!(offset(&code, ALLOCATOR_READS), 0);
    }

    #[test]
    fn a_stack_change_keeps_offset_zero_when_the_stack_is_read() {
        // sub $8,%rsp; push %rbp: the return address is no longer at %rsp.
        let code = [0x48, 0x83, 0xec, 0x08, 0x55];
        assert_eq!(offset(&code, ALLOCATOR_READS), 0);
        assert_eq!(offset(&code, FREE_READS), 0);
        // A probe that reads no stack may go past it.
        let registers_only = ProbeReads {
            stack: false,
            ..FREE_READS
        };
        assert_eq!(offset(&code, registers_only), 4);
    }

    #[test]
    fn a_write_to_a_register_the_function_takes_no_argument_in_is_skipped() {
        // CPython's PyObject_Malloc: mov %rdi,%rsi; test %rdi,%rdi; js +0x18
        let code = [0x48, 0x89, 0xfe, 0x48, 0x85, 0xff, 0x78, 0x18];
        let malloc = ProbeReads::allocator(&[0, NO_ARG]).unwrap();
        assert_eq!(offset(&code, malloc), 6);
        // A function taking a second argument in %rsi stays at 0.
        let realloc = ProbeReads::allocator(&[1, NO_ARG, 0]).unwrap();
        assert_eq!(offset(&code, realloc), 0);
    }

    #[test]
    fn an_argument_past_the_registers_has_no_reads() {
        assert!(ProbeReads::allocator(&[6]).is_none());
        assert!(ProbeReads::allocator(&[5]).is_some());
        assert_eq!(release_reads(0).unwrap().arguments, FREE_READS.arguments);
    }

    #[test]
    fn a_memory_write_keeps_offset_zero() {
        // mov %rax,(%rsi); push %rbp
        let code = [0x48, 0x89, 0x06, 0x55];
        assert_eq!(offset(&code, FREE_READS), 0);
    }

    #[test]
    fn glibc_free_is_probed_past_its_test() {
        let libc = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let data = std::fs::read(libc).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let (address, code) = crate::host::elf::function_code(&file, "free").unwrap();
        // Debian 12's glibc: `test %rdi,%rdi; je ...`.
        let targets = branch_targets(code, address);
        assert_eq!(probe_offset(code, address, FREE_READS, &targets), 3);
    }
}
