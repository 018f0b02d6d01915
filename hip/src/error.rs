//! The one error type of this crate.

/// What went wrong with HIP or hiprtc.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum HipError {
    /// No candidate of a ROCm library loaded (ROCm is not installed, or not where we look).
    #[error("ROCm not found: {lib} did not load ({reason}); searched: {searched}")]
    LibraryNotFound {
        /// The library looked for (`libamdhip64`, `libhiprtc`).
        lib: String,
        /// The loader's message for the last candidate.
        reason: String,
        /// Every path tried, in order.
        searched: String,
    },
    /// The library loaded but lacks a required symbol (too old, or not ROCm's).
    #[error("{lib} at {path} lacks {symbol}: not a usable ROCm library")]
    MissingSymbol {
        /// The library.
        lib: String,
        /// Where it was loaded from.
        path: String,
        /// The missing symbol.
        symbol: &'static str,
    },
    /// ROCm loaded but sees no AMD GPU (`hipGetDeviceCount` reports none or `hipErrorNoDevice`).
    #[error("no AMD GPU: {detail}")]
    NoDevice {
        /// What the runtime said.
        detail: String,
    },
    /// A HIP runtime call failed.
    #[error("{call} failed: {message} (hipError_t {code})")]
    Runtime {
        /// The function called.
        call: &'static str,
        /// Its status.
        code: i32,
        /// `hipGetErrorString` of it.
        message: String,
    },
    /// hiprtc refused a source: the compiler's log names the line.
    #[error("hiprtc could not compile {name} for {arch}: {log}")]
    Compile {
        /// The source's name.
        name: String,
        /// The target (`gfx90a`).
        arch: String,
        /// hiprtc's program log, or the failed call.
        log: String,
    },
    /// A copy would run past the end of a device buffer.
    #[error("{op} of {bytes} bytes on a device buffer of {len} bytes")]
    OutOfBounds {
        /// `write` or `read`.
        op: &'static str,
        /// Bytes asked for.
        bytes: usize,
        /// The buffer's size.
        len: usize,
    },
    /// A kernel source or option held an interior NUL byte.
    #[error("{what} contains a NUL byte")]
    Nul {
        /// What held it.
        what: &'static str,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, HipError>;
