//! all_reduce: every rank ends with the reduction of every rank's buffer.

pub mod direct;
pub mod halving_doubling;
pub mod ring;
pub mod tree;
