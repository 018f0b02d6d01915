//! scatter: block `j` of the root's inputs lands in rank `j`'s output.

pub mod direct;
pub mod tree;
