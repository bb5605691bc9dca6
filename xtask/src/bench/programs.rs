//! The programs the rows run, compiled under target/bench.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Result;

use super::rows::{Workload, ALLOCATOR_LIBRARIES};
use crate::{
    process::run,
    workspace::{compile, compile_with, root},
};

pub struct Programs {
    /// bench/alloc_loop.c: the malloc loop, with frame pointers.
    pub alloc_loop: PathBuf,
    /// bench/many_stacks.c: one call from each of N distinct stacks.
    pub many_stacks: PathBuf,
    /// bench/deep_loop.c without frame pointers.
    deep_loop: PathBuf,
    /// bench/new_loop.cpp: C++'s new[] and delete[].
    new_loop: PathBuf,
    /// The malloc loop linked with each of ALLOCATOR_LIBRARIES.
    linked: HashMap<&'static str, PathBuf>,
    /// The C library, whose malloc the bpftrace rows probe.
    pub libc: PathBuf,
}

impl Programs {
    /// Compiles them all into `dir`.
    pub fn build(dir: &Path) -> Result<Programs> {
        let root = root();
        let alloc_loop = dir.join("alloc_loop");
        let many_stacks = dir.join("many_stacks");
        compile("bench/alloc_loop.c", &alloc_loop)?;
        compile("bench/many_stacks.c", &many_stacks)?;
        let deep_loop = dir.join("deep_loop_nofp");
        compile_with("bench/deep_loop.c", &deep_loop, "-fomit-frame-pointer")?;
        let new_loop = dir.join("new_loop");
        run(Command::new("g++")
            .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
            .arg(&new_loop)
            .arg(root.join("bench/new_loop.cpp")))?;
        let mut linked = HashMap::new();
        for library in ALLOCATOR_LIBRARIES {
            let program = dir.join(format!("alloc_loop_{library}"));
            run(Command::new("gcc")
                .args(["-O2", "-g", "-fno-omit-frame-pointer", "-o"])
                .arg(&program)
                .arg(root.join("bench/alloc_loop.c"))
                .arg(format!("-l{library}")))?;
            linked.insert(library, program);
        }
        let libc = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6")?;
        Ok(Programs {
            alloc_loop,
            many_stacks,
            deep_loop,
            new_loop,
            linked,
            libc,
        })
    }

    /// The program of `workload`, and the argument it takes after the
    /// allocation count, if any.
    pub fn of(&self, workload: Workload) -> (&Path, Option<String>) {
        match workload {
            Workload::AllocLoop => (&self.alloc_loop, None),
            Workload::NewLoop => (&self.new_loop, None),
            Workload::Linked(library) => (&self.linked[library], None),
            // deep_loop's DEPTH argument: frames minus main's 5.
            Workload::DeepNoFp(frames) => (&self.deep_loop, Some((frames - 5).to_string())),
        }
    }
}
