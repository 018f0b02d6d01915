//! all_to_all (also _single and _v_single): block `j` of rank `i`'s input lands in block `i` of
//! rank `j`'s output.

pub mod bruck;
pub mod direct;
pub mod dynamic;
pub mod pairwise;
