//! The operations of a window, as the progress thread runs them ([`crate::Op::Window`]).

use std::sync::Arc;

use super::staged::StagedWait;
use crate::span::Span;
use crate::transport::{RegionId, RegionSink, RemoteKey};

/// One window operation. Issued through [`super::Window`], which checked its arguments.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum WindowOp {
    /// Registers `buf` with the transports (local): the region's key is written to `key_out`
    /// ([`RemoteKey::LEN`] bytes).
    Register {
        /// The window's memory.
        buf: Span,
        /// Where its key goes.
        key_out: Span,
        /// For memory puts cannot write directly (a device's), `buf` is host staging and the
        /// sink copies each landed put home.
        sink: Option<Arc<dyn RegionSink>>,
    },
    /// Writes `src` at byte `offset` of `peer`'s region `key`.
    Put {
        /// The data.
        src: Span,
        /// Target rank.
        peer: usize,
        /// Its region.
        key: RemoteKey,
        /// Byte offset in its region.
        offset: u64,
    },
    /// Copies `src` into `dst`, a part of this rank's own registered memory (a put to self).
    LocalPut {
        /// The data.
        src: Span,
        /// Where it goes (checked inside the local registration).
        dst: Span,
    },
    /// Adds one to the counter `peer`'s region keeps for this rank, after this rank's earlier
    /// puts to it.
    Signal {
        /// Target rank.
        peer: usize,
        /// Its region.
        key: RemoteKey,
    },
    /// Waits until the counter the local region keeps for `peer` reaches `target`.
    WaitSignal {
        /// The local region.
        region: RegionId,
        /// The signalling rank.
        peer: usize,
        /// The count to reach.
        target: u64,
        /// On a staged window: the list to fill with the ranges the signal covers, for the
        /// device to copy home once the wait passed.
        staged: Option<StagedWait>,
    },
    /// Collective end of a registration: a fence to and from every peer (so every put and
    /// signal sent before it has arrived), then the region is forgotten.
    Deregister {
        /// The local region.
        region: RegionId,
        /// Every rank's key (this rank's included).
        keys: Vec<RemoteKey>,
    },
    /// Forgets a local region without telling peers (a registration that failed everywhere).
    Forget {
        /// The local region.
        region: RegionId,
    },
}

impl WindowOp {
    /// The operation's name in errors and traces.
    pub fn name(&self) -> &'static str {
        match self {
            WindowOp::Register { .. } => "window_register",
            WindowOp::Put { .. } | WindowOp::LocalPut { .. } => "window_put",
            WindowOp::Signal { .. } => "window_signal",
            WindowOp::WaitSignal { .. } => "window_wait_signal",
            WindowOp::Deregister { .. } => "window_deregister",
            WindowOp::Forget { .. } => "window_deregister",
        }
    }

    /// Bytes it moves (for traces).
    pub fn bytes(&self) -> usize {
        match self {
            WindowOp::Put { src, .. } | WindowOp::LocalPut { src, .. } => src.len(),
            _ => 0,
        }
    }
}
