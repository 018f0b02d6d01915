//! all_reduce: every rank ends with the reduction of every rank's buffer.

pub mod ring;
