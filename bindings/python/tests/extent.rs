//! Unit tests of the tensor extent check (`src/extent.rs`). The extension itself is a cdylib
//! that needs an interpreter, so its pure modules are compiled into this test on their own.

#[path = "../src/extent.rs"]
mod extent;
