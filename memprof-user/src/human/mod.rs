//! What people read: errors on one line with an exit code, counts and
//! sizes as people write them, and names from other processes escaped.
pub mod error;
pub mod escape;
pub mod numbers;
