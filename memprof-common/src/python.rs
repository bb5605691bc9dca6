//! Where CPython keeps what a thread's Python stack is read from, per
//! minor version: offsets in bytes on x86-64, measured on pyenv's 3.8 to
//! 3.13 and Debian's 3.11 (each read back from a live interpreter), and
//! equal to the `_Py_DebugOffsets` 3.13 carries itself.

/// A field a version does not have.
pub const NO_FIELD: u32 = u32::MAX;

/// How a frame says which instruction it runs.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstructionField {
    /// `f_lasti`, an int: the byte offset (3.8, 3.9).
    LastiBytes = 0,
    /// `f_lasti`, an int: the code unit (3.10), 2 bytes each.
    LastiUnits = 1,
    /// A pointer into the code object's bytecode (3.11 and later), which
    /// starts at `PythonLayout::code_bytecode` in the code object.
    Pointer = 2,
}

/// How a frame says that the C function that runs it (the eval loop) was
/// entered for it: where one native frame of the interpreter ends its
/// run of Python frames.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryMark {
    /// Every Python frame has an eval call of its own (3.8 to 3.10).
    EveryFrame = 0,
    /// A bool, true on the first frame of an eval call (3.11).
    IsEntry = 1,
    /// A shim frame owned by the C stack (`owner` == 3) lies below the
    /// first frame of an eval call; it is no Python frame (3.12, 3.13).
    CStackShim = 2,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PythonLayout {
    /// `_PyRuntime` → the main interpreter (`interpreters.main`).
    pub runtime_main_interpreter: u32,
    /// Interpreter → its first thread state (`tstate_head`, later
    /// `threads.head`).
    pub interpreter_threads: u32,
    /// Thread state → the next one (`next`).
    pub thread_next: u32,
    /// Thread state → its thread's `pthread_self()` (`thread_id`).
    pub thread_id: u32,
    /// Thread state → its kernel thread id (`native_thread_id`, 3.11+).
    pub thread_native_id: u32,
    /// Thread state → its innermost frame: `frame` (≤ 3.10), `cframe`
    /// (3.11, 3.12: then `cframe_frame` in it), `current_frame` (3.13).
    pub thread_frame: u32,
    /// `_PyCFrame` → `current_frame` (3.11, 3.12), else [`NO_FIELD`].
    pub cframe_frame: u32,
    /// Frame → its caller's (`f_back`, `previous`).
    pub frame_previous: u32,
    /// Frame → its code object (`f_code`, 3.13's `f_executable`).
    pub frame_code: u32,
    /// Frame → its instruction (`f_lasti`, `prev_instr`, `instr_ptr`).
    pub frame_instruction: u32,
    pub instruction: InstructionField,
    /// Code object → its bytecode (`co_code_adaptive`, 3.11+).
    pub code_bytecode: u32,
    /// Frame → its entry mark (`is_entry`, `owner`; one byte).
    pub frame_entry: u32,
    pub entry: EntryMark,
}

/// The layout of CPython 3.`minor`, for the versions memprof knows.
pub const fn layout(minor: u32) -> Option<PythonLayout> {
    let until_3_10 = PythonLayout {
        runtime_main_interpreter: 40,
        interpreter_threads: 8,
        thread_next: 8,
        thread_id: 176,
        thread_native_id: NO_FIELD,
        thread_frame: 24,
        cframe_frame: NO_FIELD,
        frame_previous: 24,
        frame_code: 32,
        frame_instruction: 104,
        instruction: InstructionField::LastiBytes,
        code_bytecode: NO_FIELD,
        frame_entry: NO_FIELD,
        entry: EntryMark::EveryFrame,
    };
    Some(match minor {
        8 | 9 => until_3_10,
        10 => PythonLayout {
            frame_instruction: 96,
            instruction: InstructionField::LastiUnits,
            ..until_3_10
        },
        11 => PythonLayout {
            runtime_main_interpreter: 48,
            interpreter_threads: 16,
            thread_next: 8,
            thread_id: 152,
            thread_native_id: 160,
            thread_frame: 56,
            cframe_frame: 8,
            frame_previous: 48,
            frame_code: 32,
            frame_instruction: 56,
            instruction: InstructionField::Pointer,
            code_bytecode: 184,
            frame_entry: 68,
            entry: EntryMark::IsEntry,
        },
        12 => PythonLayout {
            runtime_main_interpreter: 48,
            interpreter_threads: 72,
            thread_next: 8,
            thread_id: 136,
            thread_native_id: 144,
            thread_frame: 56,
            cframe_frame: 0,
            frame_previous: 8,
            frame_code: 0,
            frame_instruction: 56,
            instruction: InstructionField::Pointer,
            code_bytecode: 192,
            frame_entry: 70,
            entry: EntryMark::CStackShim,
        },
        13 => PythonLayout {
            runtime_main_interpreter: 640,
            interpreter_threads: 7344,
            thread_next: 8,
            thread_id: 152,
            thread_native_id: 160,
            thread_frame: 72,
            cframe_frame: NO_FIELD,
            frame_previous: 8,
            frame_code: 0,
            frame_instruction: 56,
            instruction: InstructionField::Pointer,
            code_bytecode: 200,
            frame_entry: 70,
            entry: EntryMark::CStackShim,
        },
        _ => return None,
    })
}

/// `owner` of a 3.12+ frame that the C stack owns (a shim, no Python
/// frame).
pub const FRAME_OWNED_BY_CSTACK: u8 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_version_has_a_layout() {
        for minor in 8..=13 {
            assert!(layout(minor).is_some(), "3.{minor}");
        }
        assert!(layout(7).is_none());
        assert!(layout(14).is_none());
    }
}
