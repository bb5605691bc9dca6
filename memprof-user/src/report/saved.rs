//! Saved JSON reports: loading them back and cutting them again
//! (`memprof report`, `memprof diff`).
use std::{fs, path::Path};

use anyhow::Result;

use super::{
    model::{Report, REPORT_VERSION},
    stacks::{cut, group_by_caller},
};
use crate::{
    cli::{GroupBy, ReportOptions},
    error::UserError,
};

pub fn load(path: &Path) -> Result<Report> {
    let shown = path.display().to_string();
    let text = fs::read_to_string(path)
        .map_err(|err| UserError::new(format!("{shown}: cannot read it: {err}")))?;
    parse(&text, &shown)
}

/// A saved report from its text; `shown` names it in errors (one line each).
pub fn parse(text: &str, shown: &str) -> Result<Report> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|err| UserError::new(format!("{shown}: not JSON: {err}")))?;
    match value.get("version").and_then(|v| v.as_u64()) {
        Some(version) if version == REPORT_VERSION as u64 => {}
        Some(version) => {
            return Err(UserError::new(format!(
                "{shown}: report version {version}; this memprof reads version {REPORT_VERSION}"
            ))
            .into())
        }
        None => {
            return Err(UserError::new(format!(
                "{shown}: not a memprof JSON report (no \"version\" field)"
            ))
            .into())
        }
    }
    serde_json::from_value(value)
        .map_err(|err| UserError::new(format!("{shown}: not a memprof JSON report: {err}")).into())
}

/// Applies --group-by caller, --min-bytes, --top and --depth to a saved
/// report. It holds only the stacks it was saved with.
pub fn recut(mut report: Report, options: &ReportOptions) -> Report {
    let regroup = options.group_by == GroupBy::Caller && report.group_by != "caller";
    let drop_dead = report
        .live
        .as_ref()
        .is_some_and(|live| live.min_age_secs.is_some());
    for process in &mut report.processes {
        if regroup {
            process.stacks = group_by_caller(std::mem::take(&mut process.stacks));
        }
        cut(&mut process.stacks, options, drop_dead);
        if let Some(live) = &mut process.live {
            if regroup {
                live.peak_stacks = group_by_caller(std::mem::take(&mut live.peak_stacks));
            }
            cut(&mut live.peak_stacks, options, true);
        }
    }
    if regroup {
        report.group_by = "caller".to_string();
    }
    report
}
