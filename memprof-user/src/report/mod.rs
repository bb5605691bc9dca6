//! Reports: the model (what a report holds), how it is built from a
//! snapshot, and how it is rendered.
pub mod build;
pub mod chrome;
pub mod diff;
pub mod filters;
pub mod flamegraph;
pub mod folded;
pub mod json;
pub mod markdown;
pub mod model;
pub mod options;
pub mod pprof;
pub mod saved;
pub mod series;
pub mod stacks;
pub mod text;
pub mod timeline;
pub mod timeline_svg;
pub mod tsv;

use std::{fs, io::Write as _, os::unix::fs::OpenOptionsExt as _, path::Path};

use anyhow::Result;
pub use model::Report;

use crate::{human::error::UserError, report::options::Format};

/// Renders `report` and writes it to `output` (a file, replaced) or stdout.
pub fn emit(report: &Report, format: Format, output: Option<&Path>) -> Result<()> {
    let rendered = match format {
        Format::Text => match output {
            Some(_) => text::render(report),
            None => text::render_for(report, text::Terminal::of_stdout()),
        }
        .into_bytes(),
        Format::Json => json::render(report)?.into_bytes(),
        Format::Folded => folded::render(report).into_bytes(),
        Format::Tsv => tsv::render(report).into_bytes(),
        Format::Markdown => markdown::render(report).into_bytes(),
        Format::Flamegraph => flamegraph::render(report)?.into_bytes(),
        Format::Pprof => pprof::render(report)?,
        Format::Timeline => timeline_svg::render(report)?.into_bytes(),
        Format::Chrome => chrome::render(report)?.into_bytes(),
    };
    write_out(&rendered, output)
}

/// Writes `rendered` to `output` (a file, see [`open_output`]) or stdout.
pub fn write_out(rendered: &[u8], output: Option<&Path>) -> Result<()> {
    match output {
        Some(path) => open_output(path)?
            .write_all(rendered)
            .map_err(|err| output_error(path, err)),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(rendered)?;
            stdout.flush()?;
            Ok(())
        }
    }
}

/// Opens the report file `path` for writing. A new file is created mode
/// 0600 (reports hold command lines and paths) and, under sudo, given to
/// the user who ran sudo; an existing file is emptied and keeps its owner
/// and mode. A symbolic link is not followed: it is refused.
fn open_output(path: &Path) -> Result<fs::File> {
    match create_new(path) {
        Ok(file) => {
            give_to_sudo_caller(&file);
            return Ok(file);
        }
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(output_error(path, err)),
    }
    fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|err| output_error(path, err))
}

/// Creates `path` as a new report file, mode 0600 (reports hold command
/// lines and paths). O_EXCL: fails on any existing name, a dangling
/// symbolic link too.
pub fn create_new(path: &Path) -> std::io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Checks that the report can be written to `output`, before profiling
/// starts: an existing file is opened for writing (not emptied), a new
/// one created and removed again (nothing is left behind if profiling
/// fails). A device or a pipe is left to the write.
pub fn check_output(output: Option<&Path>) -> Result<()> {
    let Some(path) = output else {
        return Ok(());
    };
    match fs::symlink_metadata(path) {
        Ok(metadata) if metadata.is_symlink() => Err(output_error(
            path,
            std::io::Error::from_raw_os_error(libc::ELOOP),
        )),
        Ok(metadata) if metadata.is_dir() => Err(output_error(
            path,
            std::io::Error::from_raw_os_error(libc::EISDIR),
        )),
        Ok(metadata) if metadata.is_file() => fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map(drop)
            .map_err(|err| output_error(path, err)),
        Ok(_) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            create_new(path).map_err(|err| output_error(path, err))?;
            fs::remove_file(path).map_err(|err| output_error(path, err))
        }
        Err(err) => Err(output_error(path, err)),
    }
}

/// One line naming the report file; exit code 2, as for a bad option.
fn output_error(path: &Path, err: std::io::Error) -> anyhow::Error {
    let shown = path.display();
    let message = match err.raw_os_error() {
        Some(libc::ELOOP) => format!(
            "{shown} is a symbolic link: memprof does not follow it for its report (name the file it points to)"
        ),
        Some(libc::EISDIR) => format!("{shown} is a directory"),
        _ => format!("cannot write the report to {shown}: {err}"),
    };
    UserError::new(message).with_exit_code(2).into()
}

/// Under sudo, a report memprof created belongs to the user who ran sudo
/// (it still has mode 0600), who can then read it without root
/// (`memprof report`, `memprof diff`). Best effort.
fn give_to_sudo_caller(file: &fs::File) {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let id = |name: &str| std::env::var(name).ok()?.parse::<u32>().ok();
    let Some(uid) = id("SUDO_UID") else {
        return;
    };
    let _ = nix::unistd::fchown(
        file,
        Some(nix::unistd::Uid::from_raw(uid)),
        id("SUDO_GID").map(nix::unistd::Gid::from_raw),
    );
}
