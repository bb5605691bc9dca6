//! `completions` and `man`: the shells' completion scripts and the man
//! pages, generated from the command line's own definition.
use std::io::Write as _;

use anyhow::Result;
use clap::CommandFactory as _;

use crate::{
    cli::{Cli, CompletionsArgs, ManArgs},
    human::error::UserError,
};

pub(super) fn completions(args: CompletionsArgs) -> Result<i32> {
    let mut command = Cli::command();
    let mut stdout = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut command, "memprof", &mut stdout);
    stdout.flush()?;
    Ok(0)
}

/// memprof(1), or memprof-COMMAND(1): a command's page names it so, as
/// git's and cargo's do.
pub(super) fn man(args: ManArgs) -> Result<i32> {
    let top = Cli::command();
    let page = match args.command.as_deref() {
        None => top,
        Some(name) => {
            let Some(command) = top.find_subcommand(name) else {
                return Err(UserError::new(format!(
                    "no command {name:?} (trace, attach, monitor, report, diff, doctor, completions, man)"
                ))
                .with_exit_code(2)
                .into());
            };
            let command = command.clone();
            let title = format!("memprof-{name}");
            command.name(title.clone()).bin_name(title)
        }
    };
    let mut rendered = Vec::new();
    clap_mangen::Man::new(page)
        .source(format!("memprof {}", env!("CARGO_PKG_VERSION")))
        .render(&mut rendered)?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&rendered)?;
    stdout.flush()?;
    Ok(0)
}
