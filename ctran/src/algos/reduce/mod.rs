//! reduce: the root ends with the reduction of every rank's buffer; other buffers are unchanged.

pub mod direct;
pub mod tree;
