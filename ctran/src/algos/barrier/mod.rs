//! barrier: no rank leaves before every rank has entered.

pub mod dissemination;
