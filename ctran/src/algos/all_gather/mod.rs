//! all_gather (also _single and _v): every rank's input lands in slot `rank` of every output.

pub mod bruck;
pub mod direct;
pub mod recursive_doubling;
pub mod ring;
