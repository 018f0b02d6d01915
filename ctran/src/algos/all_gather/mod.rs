//! all_gather (also _single and _v): every rank's input lands in slot `rank` of every output.

pub mod ring;
