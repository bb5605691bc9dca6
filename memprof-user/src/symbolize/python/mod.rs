//! Naming Python frames: a code object read from the process that ran it
//! ([`code_object`]) and the source line of an instruction in it
//! ([`line_table`]), at the layout and in the encoding of each CPython
//! version.
pub mod code_object;
pub mod line_table;

#[cfg(test)]
mod walk_tests;
