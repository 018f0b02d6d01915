//! reduce_scatter (also _single and _v): rank `r` ends with the reduction of block `r` of every
//! rank's input.

pub mod direct;
pub mod recursive_halving;
pub mod ring;
