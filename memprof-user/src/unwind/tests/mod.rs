//! Tests on real files and real stacks. `tables`: the tables of the
//! system's libraries and programs, the cache, and the cost of the tables
//! of a whole Python process. `walks`: this test binary's own stack
//! unwound and compared with libgcc's unwinder, and a C program without
//! frame pointers stopped under gdb and compared with gdb's backtrace.
//! This module holds what both print.
use super::table::Row;

mod tables;
mod walks;

/// A row as failure messages show it.
fn describe(row: Option<Row>) -> String {
    match row {
        Some(row) => format!(
            "{:?} {:+} (rbp {:?} {})",
            row.cfa_kind(),
            row.cfa_offset(),
            row.rbp_kind(),
            row.aux
        ),
        None => "none".to_string(),
    }
}
