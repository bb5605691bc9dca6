//! `memprof report` and `memprof diff`: saved reports read, cut again,
//! compared.
use anyhow::Result;

use crate::{
    cli::{DiffArgs, DiffFormat, ReportArgs},
    human::error::UserError,
    report,
};

pub(super) fn rerender(args: ReportArgs) -> Result<i32> {
    report::check_output(args.report.output.as_deref())?;
    let saved = report::saved::load(&args.file, args.max_report_size.0)?;
    super::check_sort(args.report.sort, saved.mode == "live")?;
    let report = report::saved::recut(saved, &args.report);
    report::emit(report, &args.report)?;
    Ok(0)
}

pub(super) fn diff(args: DiffArgs) -> Result<i32> {
    report::check_output(args.output.as_deref())?;
    let mut base = report::saved::load(&args.base, args.max_report_size.0)?;
    let mut new = report::saved::load(&args.new, args.max_report_size.0)?;
    if args.format == DiffFormat::Text {
        base.escape_names();
        new.escape_names();
    }
    if let Some(reason) = report::diff::incomparable(&base, &new) {
        return Err(UserError::new(format!("cannot compare these reports: {reason}")).into());
    }
    let diff = report::diff::diff(&base, &new, args.top);
    let rendered = match args.format {
        DiffFormat::Text => report::diff::render_text(&diff),
        DiffFormat::Json => report::diff::render_json(&diff)?,
    };
    report::write_out(rendered.as_bytes(), args.output.as_deref())?;
    Ok(0)
}
