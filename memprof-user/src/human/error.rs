//! Errors the user can cause and fix: printed as one line, with an exit code.
use std::fmt;

#[derive(Debug)]
pub struct UserError {
    pub message: String,
    pub exit_code: i32,
}

impl UserError {
    pub fn new(message: impl Into<String>) -> Self {
        UserError {
            message: message.into(),
            exit_code: 1,
        }
    }

    pub fn with_exit_code(mut self, exit_code: i32) -> Self {
        self.exit_code = exit_code;
        self
    }
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UserError {}

/// The error and its causes on one line, escaped: they may name what a
/// profiled process controls (its files, its functions).
pub fn one_line(err: &anyhow::Error) -> String {
    let text = err
        .chain()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    super::escape::escaped(&text).into_owned()
}
