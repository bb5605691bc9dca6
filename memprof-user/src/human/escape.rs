//! Names other processes control (their comm, command line, paths, the
//! functions and files of their binaries), made safe to print: a control
//! character would reach root's terminal as a command to it (retitle,
//! clear the screen, fake a line), or make an SVG ill-formed. Each one is
//! written as an escape instead, as journald and `ps` do.
use std::{borrow::Cow, fmt::Write as _};

/// A control character (C0, DEL or C1): what a terminal may act on.
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `text` with each control character written as `\xNN` (C0 and DEL) or
/// `\u{NN}` (C1); unchanged, and not copied, when it has none.
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !is_control(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// Escapes `text` in place (see [`escaped`]).
pub fn escape_in_place(text: &mut String) {
    if let Cow::Owned(escaped) = escaped(text) {
        *text = escaped;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_escapes() {
        assert_eq!(escaped("python3 app.py"), "python3 app.py");
        assert!(matches!(escaped("plain"), Cow::Borrowed(_)));
        assert_eq!(escaped("\x1b]0;owned\x07"), "\\x1b]0;owned\\x07");
        assert_eq!(escaped("a\nb\tc\r\x7f"), "a\\x0ab\\x09c\\x0d\\x7f");
        // C1's CSI, which some terminals read as ESC [.
        assert_eq!(escaped("\u{9b}2J"), "\\u{9b}2J");
        // Printable text beyond ASCII stays as it is.
        assert_eq!(escaped("größe 名前"), "größe 名前");
    }
}
