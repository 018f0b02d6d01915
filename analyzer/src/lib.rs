//! # comms-analyzer
//!
//! Reads the colltrace dumps of all ranks (files, or the live endpoints of running ranks) and
//! gives a verdict per communicator: the last sequence number every rank completed and started,
//! the ranks that are behind and the operation they are stuck in, operations that differ across
//! ranks at the same sequence number, ranks that never joined, the slowest rank per operation,
//! and a timeline per rank; as text, JSON, or a web page.
//!
//! ```
//! use comms_analyzer::{analyze, Options};
//! let v = analyze(&[], Vec::new(), &Options::default());
//! assert_eq!(v.summary, vec!["no communicator found in the dumps".to_string()]);
//! ```
//!
//! The binary `comms-analyzer` (`report DIR`, `watch`, `serve`) is the usual entry point.

pub mod cli;
pub mod load;
pub mod render;
pub mod verdict;

use std::path::PathBuf;
use std::time::Duration;

use colltrace::Dump;
pub use load::Problem;
pub use verdict::{analyze, Options, Verdict};

/// Where dumps come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Files `*.json` in a directory.
    Dir(PathBuf),
    /// Live endpoints published in the TCPStore at `host:port`.
    Store(String),
    /// Live endpoints, `host:port` each.
    Endpoints(Vec<String>),
}

impl Source {
    /// Reads every dump; unreadable files and unreachable endpoints become problems. Errors
    /// only when nothing can be read at all (no such directory).
    pub fn collect(&self, timeout: Duration) -> Result<(Vec<Dump>, Vec<Problem>), load::Error> {
        match self {
            Source::Dir(d) => load::read_dir(d),
            Source::Endpoints(eps) => Ok(load::poll(eps, timeout)),
            Source::Store(addr) => match load::endpoints_from_store(addr, timeout) {
                Ok(eps) if eps.is_empty() => Ok((
                    Vec::new(),
                    vec![Problem {
                        source: format!("store {addr}"),
                        reason:
                            "no live endpoint published yet (ranks need TORCHCOMMS_TRACE_HTTP=1)"
                                .into(),
                    }],
                )),
                Ok(eps) => Ok(load::poll(&eps, timeout)),
                Err(e) => Ok((
                    Vec::new(),
                    vec![Problem {
                        source: format!("store {addr}"),
                        reason: e.to_string(),
                    }],
                )),
            },
        }
    }
}
