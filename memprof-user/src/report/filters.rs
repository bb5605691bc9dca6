//! --focus, --ignore and --skip-frames: which stacks a report keeps, and
//! from which frame on (as pprof's -focus, -ignore; Crystal's STACK_SKIP).
//! The same rules serve a live profile (`stacks`) and a saved one (`saved`).
use std::sync::Arc;

use regex::Regex;

use super::model::{FiltersReport, FrameReport};
use crate::report::options::ReportOptions;

pub struct StackFilter<'a> {
    focus: Option<&'a Regex>,
    ignore: Option<&'a Regex>,
    skip_frames: usize,
}

impl<'a> StackFilter<'a> {
    pub fn of(options: &'a ReportOptions) -> StackFilter<'a> {
        StackFilter {
            focus: options.filters.focus.as_ref(),
            ignore: options.filters.ignore.as_ref(),
            skip_frames: options.filters.skip_frames,
        }
    }

    pub fn is_active(&self) -> bool {
        self.focus.is_some() || self.ignore.is_some() || self.skip_frames > 0
    }

    /// Whether --skip-frames drops frames.
    pub fn skips(&self) -> bool {
        self.skip_frames > 0
    }

    /// Whether --focus or --ignore may hide stacks.
    pub fn hides(&self) -> bool {
        self.focus.is_some() || self.ignore.is_some()
    }

    /// Whether a stack with these frames stays: one matches --focus (when
    /// given) and none matches --ignore.
    pub fn keeps<'f>(&self, frames: impl Iterator<Item = &'f FrameReport> + Clone) -> bool {
        let any = |pattern: &Regex| frames.clone().any(|frame| matches(pattern, frame));
        self.focus.is_none_or(any) && !self.ignore.is_some_and(any)
    }

    /// How many innermost frames (calls) of a stack of `calls` to drop:
    /// --skip-frames, but never the outermost.
    pub fn skipped(&self, calls: usize) -> usize {
        self.skip_frames.min(calls.saturating_sub(1))
    }

    /// The filters as a report lists them, nothing hidden yet.
    pub fn report(&self) -> Option<FiltersReport> {
        self.is_active().then(|| FiltersReport {
            focus: self.focus.iter().map(|p| p.as_str().to_string()).collect(),
            ignore: self.ignore.iter().map(|p| p.as_str().to_string()).collect(),
            skip_frames: self.skip_frames,
            ..FiltersReport::default()
        })
    }
}

/// A frame matches by its function's name or its source file's path.
fn matches(pattern: &Regex, frame: &FrameReport) -> bool {
    let matched = |text: &Option<String>| text.as_deref().is_some_and(|t| pattern.is_match(t));
    matched(&frame.function) || matched(&frame.file)
}

/// Drops the `filter.skipped` innermost calls of a symbolized stack: a
/// call is a frame with the frames inlined into it before it (`inlined`
/// marks a frame inlined into the one that follows).
pub fn skip_calls(frames: &mut Vec<Arc<FrameReport>>, filter: &StackFilter) {
    let calls = frames.iter().filter(|f| !f.inlined).count();
    let mut skip = filter.skipped(calls);
    if skip == 0 {
        return;
    }
    let cut = frames
        .iter()
        .position(|frame| {
            if !frame.inlined {
                skip -= 1;
            }
            skip == 0
        })
        .map_or(0, |last| last + 1);
    frames.drain(..cut);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, inlined: bool) -> FrameReport {
        FrameReport {
            address: "0x1".to_string(),
            function: Some(function.to_string()),
            file: Some(file.to_string()),
            line: Some(1),
            module: None,
            inlined,
            module_offset: None,
            build_id: None,
        }
    }

    /// A report's cut, parsed as the command line parses it.
    #[derive(clap::Parser, Debug)]
    struct Cut {
        #[command(flatten)]
        report: ReportOptions,
    }

    fn options(args: &[&str]) -> ReportOptions {
        use clap::Parser as _;
        let mut argv = vec!["memprof"];
        argv.extend_from_slice(args);
        Cut::try_parse_from(argv).unwrap().report
    }

    #[test]
    fn focus_and_ignore_look_at_functions_and_files() {
        let stack = [
            frame("xmalloc", "util.c", false),
            frame("parse_row", "src/parser.c", false),
            frame("main", "main.c", false),
        ];
        let keeps = |args: &[&str]| StackFilter::of(&options(args)).keeps(stack.iter());
        assert!(keeps(&[]));
        assert!(keeps(&["--focus", "^parse_"]));
        assert!(keeps(&["--focus", r"parser\.c$"]));
        assert!(!keeps(&["--focus", "^render"]));
        assert!(!keeps(&["--ignore", "xmalloc"]));
        assert!(!keeps(&["--focus", "parse", "--ignore", "main"]));
        assert!(keeps(&["--focus", "parse", "--ignore", "render"]));
    }

    #[test]
    fn skipping_counts_calls_not_inlined_frames() {
        let stack = [
            frame("inner", "a.c", true),
            frame("xmalloc", "a.c", false),
            frame("helper", "b.c", true),
            frame("parse", "b.c", false),
            frame("main", "main.c", false),
        ];
        let skipped = |n: &str| {
            let options = options(&["--skip-frames", n]);
            let mut frames: Vec<Arc<FrameReport>> = stack.iter().cloned().map(Arc::new).collect();
            skip_calls(&mut frames, &StackFilter::of(&options));
            frames
                .iter()
                .map(|f| f.function.clone().unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(skipped("0").len(), 5);
        assert_eq!(skipped("1"), ["helper", "parse", "main"]);
        assert_eq!(skipped("2"), ["main"]);
        // The outermost call stays.
        assert_eq!(skipped("9"), ["main"]);
    }

    #[test]
    fn a_bad_pattern_is_a_one_line_error() {
        use clap::Parser as _;
        let err = Cut::try_parse_from(["memprof", "--focus", "("])
            .unwrap_err()
            .to_string();
        assert!(err.contains("'(' is not a regular expression"), "{err}");
    }
}
