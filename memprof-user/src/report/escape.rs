//! A report as the formats people read show it: every name a profiled
//! process controls escaped (see [`crate::human::escape`]). JSON and
//! pprof keep the names exact; they are data, not text for a terminal.
use crate::{
    human::escape::escape_in_place,
    report::model::{FrameReport, Report, StackReport},
};

impl Report {
    /// Escapes, in place, every name a profiled process controls: its
    /// comm, command line, executable and cgroup, and the modules,
    /// functions and files of its frames and probes.
    pub fn escape_names(&mut self) {
        for process in &mut self.processes {
            escape_in_place(&mut process.command);
            escape_in_place(&mut process.exe);
            process.cmdline.iter_mut().for_each(escape_in_place);
            process.cgroup.iter_mut().for_each(escape_in_place);
            process.container.iter_mut().for_each(escape_in_place);
            process.container_id.iter_mut().for_each(escape_in_place);
            process.pod_uid.iter_mut().for_each(escape_in_place);
            process.stacks.iter_mut().for_each(escape_stack);
            if let Some(live) = &mut process.live {
                live.peak_stacks.iter_mut().for_each(escape_stack);
            }
        }
        for probe in &mut self.probes {
            escape_in_place(&mut probe.module);
            escape_in_place(&mut probe.function);
        }
        for unprobed in self.unprobed.iter_mut().chain(&mut self.partly_probed) {
            escape_in_place(&mut unprobed.program);
            escape_in_place(&mut unprobed.reason);
        }
        for unsymbolized in &mut self.unsymbolized {
            escape_in_place(&mut unsymbolized.module);
            escape_in_place(&mut unsymbolized.reason);
        }
    }
}

fn escape_stack(stack: &mut StackReport) {
    escape_in_place(&mut stack.allocator);
    stack.go_type.iter_mut().for_each(escape_in_place);
    stack
        .frames
        .iter_mut()
        .for_each(|frame| escape_frame(std::sync::Arc::make_mut(frame)));
}

fn escape_frame(frame: &mut FrameReport) {
    frame.function.iter_mut().for_each(escape_in_place);
    frame.file.iter_mut().for_each(escape_in_place);
    frame.module.iter_mut().for_each(escape_in_place);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_process_name_and_its_frames_are_escaped() {
        let report = crate::report::saved::parse(
            r#"{"version":1,"mode":"alloc","duration_secs":1,"exact":true,"group_by":"stack",
              "bytes":8,"count":1,"lost":{},"processes":[{"pid":1,
              "command":"\u001b]0;x\u0007","exe":"/tmp/\u001b[2J","cmdline":["a\nb"],
              "exited":true,"bytes":8,"count":1,"total_stacks":1,
              "stacks":[{"allocator":"malloc","bytes":8,"count":1,"partial":false,
              "frames":[{"address":"0x1","function":"f\u009b2J","file":"x.c","line":1,
              "module":"/m","inlined":false}]}]}]}"#,
            "test",
        );
        let mut report = report.unwrap();
        report.escape_names();
        let process = &report.processes[0];
        assert_eq!(process.command, "\\x1b]0;x\\x07");
        assert_eq!(process.exe, "/tmp/\\x1b[2J");
        assert_eq!(process.cmdline, ["a\\x0ab"]);
        assert_eq!(
            process.stacks[0].frames[0].function.as_deref(),
            Some("f\\u{9b}2J")
        );
    }
}
