//! broadcast: the root's buffer is copied to every rank.

pub mod chain;
pub mod direct;
pub mod tree;
