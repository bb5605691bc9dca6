//! The layouts of `memprof_common::python`, checked on live interpreters
//! from outside, as the kernel's walk reads them: from `_PyRuntime` to
//! the main interpreter, its thread, that thread's frames and their code
//! objects, to the function and line each frame runs.
use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use memprof_common::python::{
    layout, EntryMark, InstructionField, PythonLayout, FRAME_OWNED_BY_CSTACK, NO_FIELD,
};

use super::code_object::{read_code_object, CodeLayout};
use crate::{discover::python::interpreter_of_pid, host::procfs::memory::ProcessMemory};

/// Three frames deep in a file of its own, then waits on stdin (its line
/// 4, in `waiting`, called from line 6 of `calling`, from line 7).
const SCRIPT: &str = "import sys\n\
                      \n\
                      def waiting():\n    sys.stdin.read()\n\
                      def calling():\n    waiting()\n\
                      calling()\n";

/// (code object, byte offset of its instruction) of each Python frame of
/// the thread whose state is `thread`, innermost first.
fn python_frames(memory: &ProcessMemory, layout: &PythonLayout, thread: u64) -> Vec<(u64, u64)> {
    let word = |address: u64| memory.u64_at(address).unwrap_or(0);
    let lasti = |address: u64| memory.i32_at(address).unwrap_or(0) as u64;
    let mut frame = word(thread + u64::from(layout.thread_frame));
    if layout.cframe_frame != NO_FIELD && frame != 0 {
        frame = word(frame + u64::from(layout.cframe_frame));
    }
    let mut frames = Vec::new();
    while frame != 0 && frames.len() < 64 {
        let previous = word(frame + u64::from(layout.frame_previous));
        let shim = layout.entry == EntryMark::CStackShim
            && memory
                .bytes_at(frame + u64::from(layout.frame_entry), 1)
                .is_ok_and(|owner| owner[0] == FRAME_OWNED_BY_CSTACK);
        if !shim {
            let code = word(frame + u64::from(layout.frame_code));
            let at = frame + u64::from(layout.frame_instruction);
            let offset = match layout.instruction {
                InstructionField::LastiBytes => lasti(at),
                InstructionField::LastiUnits => lasti(at).wrapping_mul(2),
                InstructionField::Pointer => {
                    word(at).wrapping_sub(code + u64::from(layout.code_bytecode))
                }
            };
            frames.push((code, offset));
        }
        frame = previous;
    }
    frames
}

/// The function and line of each Python frame of the main thread of
/// process `pid` (CPython 3.`minor`, its runtime state at `runtime`);
/// empty while anything is unreadable.
fn named_frames(pid: u32, minor: u32, runtime: u64) -> Vec<(String, Option<i64>)> {
    let (Ok(memory), Some(layout), Some(code)) = (
        ProcessMemory::open(pid),
        layout(minor),
        CodeLayout::of(minor),
    ) else {
        return Vec::new();
    };
    let Ok(interpreter) = memory.u64_at(runtime + u64::from(layout.runtime_main_interpreter))
    else {
        return Vec::new();
    };
    let Ok(thread) = memory.u64_at(interpreter + u64::from(layout.interpreter_threads)) else {
        return Vec::new();
    };
    if thread == 0 {
        return Vec::new();
    }
    python_frames(&memory, &layout, thread)
        .into_iter()
        .map_while(|(address, offset)| {
            let object = read_code_object(&memory, &code, address).ok()?;
            Some((object.name.clone(), object.line_at(offset)))
        })
        .collect()
}

#[test]
fn frames_of_a_waiting_interpreter_name_its_functions_and_lines() {
    let script = std::env::temp_dir().join(format!("memprof-waits-{}.py", std::process::id()));
    std::fs::write(&script, SCRIPT).unwrap();
    for (_, python) in super::interpreters_here() {
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Read until it waits in `waiting` (it starts in its imports).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let found = loop {
            assert!(
                std::time::Instant::now() < deadline,
                "{python}: never seen waiting"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
            let Some(found) = interpreter_of_pid(child.id()) else {
                continue;
            };
            let named = named_frames(child.id(), found.interpreter.minor, found.runtime);
            if named.first().is_some_and(|(name, _)| name == "waiting") {
                break (found, named);
            }
        };
        drop(child.stdin.take());
        let _ = BufReader::new(child.stdout.take().unwrap()).lines().count();
        child.wait().unwrap();
        let (running, named) = found;
        assert!(running.module.contains("python"), "{python}: {running:?}");
        assert_eq!(
            named,
            [
                ("waiting".to_string(), Some(4)),
                ("calling".to_string(), Some(6)),
                ("<module>".to_string(), Some(7)),
            ],
            "{python}"
        );
    }
    let _ = std::fs::remove_file(&script);
}
