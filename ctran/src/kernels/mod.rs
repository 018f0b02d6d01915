//! Compute kernels: reductions and copies for every (dtype, op) pair.

pub mod reduce;

pub use reduce::{Reducer, FOLD_WIDTH};
