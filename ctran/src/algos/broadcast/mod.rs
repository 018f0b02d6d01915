//! broadcast: the root's buffer is copied to every rank.

pub mod tree;
