//! What people read: errors on one line with an exit code, and counts and
//! sizes as people write them.
pub mod error;
pub mod numbers;
