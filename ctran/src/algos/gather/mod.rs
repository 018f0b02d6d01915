//! gather: every rank's input lands in block `rank` of the root's outputs.

pub mod direct;
pub mod tree;
