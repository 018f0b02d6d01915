//! One-sided windows (upstream's `TorchCommWindow`): a tensor every rank registers
//! collectively, into which peers `put` and `signal`, and on which a rank `wait_signal`s.
//!
//! [`TorchComm::new_window`](crate::TorchComm::new_window) makes one; the backend supplies a
//! [`WindowBackend`] ([`crate::Backend::new_window`], which backends without windows leave to
//! its default: an error naming the backend). This layer checks every argument (peer in range,
//! registered, dtype, bounds) before the backend sees it.

use std::fmt::Debug;

use torchcomms_core::{DataType, Device};

use crate::error::{Error, Result};
use crate::options::OpOptions;
use crate::tensor::Tensor;
use crate::work::Work;

/// What a backend implements for a window. Arguments are checked by [`Window`].
pub trait WindowBackend: Send + Sync + Debug {
    /// Registers `tensor` (collective); fails on every rank when ranks disagree on its size.
    fn register(&self, tensor: &Tensor) -> Result<()>;
    /// Deregisters the tensor (collective).
    fn deregister(&self) -> Result<()>;
    /// Writes `tensor` at byte `offset_bytes` of `peer`'s registered tensor.
    fn put(
        &self,
        tensor: &Tensor,
        peer: usize,
        offset_bytes: usize,
        opts: &OpOptions,
    ) -> Result<Work>;
    /// Adds one to the signal counter `peer` keeps for this rank, after this rank's earlier puts.
    fn signal(&self, peer: usize, opts: &OpOptions) -> Result<Work>;
    /// Consumes one signal of `peer`.
    fn wait_signal(&self, peer: usize, opts: &OpOptions) -> Result<Work>;
    /// A persistent all-gather's round in one operation, where the backend has one: `tensor`
    /// goes to byte `offset_bytes` of every rank's registered tensor, with the free and data
    /// signals of [`crate::TorchComm::all_gather_p_exec`]. `None`: compose it from puts and
    /// signals.
    fn all_gather(
        &self,
        tensor: &Tensor,
        offset_bytes: usize,
        opts: &OpOptions,
    ) -> Option<Result<Work>> {
        let _ = (tensor, offset_bytes, opts);
        None
    }
    /// Whether `tensor` (on this device) could be registered: what a persistent all-gather
    /// asks before it runs on a window instead of an all-gather.
    fn supports(&self, tensor: &Tensor) -> bool {
        let _ = tensor;
        true
    }
    /// Where `rank`'s registered memory is mapped in this process, if it is (this rank's own
    /// always; peers' where the transport maps them, as NVLink does).
    fn mapped_addr(&self, rank: usize) -> Option<u64> {
        let _ = rank;
        None
    }
}

/// How a peer's window memory can be reached from this rank (upstream's
/// `TorchCommWinAccessType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WinAccessType {
    /// The peer's memory can be mapped here ([`Window::map_remote_tensor`]).
    Unified,
    /// Only through puts and signals.
    Separate,
}

/// Attributes of a peer's window (upstream's `TorchCommWinAttr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowAttr {
    /// How the peer's memory is reached.
    pub access_type: WinAccessType,
}

/// A window of a communicator.
#[derive(Debug)]
pub struct Window {
    inner: Box<dyn WindowBackend>,
    rank: usize,
    size: usize,
    /// The registered tensor.
    tensor: std::sync::Mutex<Option<Tensor>>,
}

impl Window {
    pub(crate) fn new(inner: Box<dyn WindowBackend>, rank: usize, size: usize) -> Window {
        Window {
            inner,
            rank,
            size,
            tensor: std::sync::Mutex::new(None),
        }
    }

    fn registered(&self, op: &str) -> Result<Tensor> {
        self.tensor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    "window",
                    "a window with a registered tensor (call tensor_register first)",
                    "a window without one (never registered, or deregistered)",
                )
            })
    }

    fn check_peer(&self, op: &str, peer: usize) -> Result<()> {
        if peer >= self.size || peer == self.rank {
            return Err(Error::invalid(
                op,
                "peer",
                format!("another rank in 0..{} (not {})", self.size, self.rank),
                peer,
            ));
        }
        Ok(())
    }

    /// Registers `tensor` (collective: every rank calls it, with tensors of one size).
    pub fn tensor_register(&self, tensor: &Tensor) -> Result<()> {
        let op = "tensor_register";
        if self
            .tensor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Err(Error::invalid(
                op,
                "tensor",
                "a window without a registered tensor (call tensor_deregister first)",
                "a window that has one",
            ));
        }
        if !tensor.is_contiguous() {
            return Err(Error::invalid(
                op,
                "tensor",
                "a contiguous tensor",
                "a strided one",
            ));
        }
        self.inner.register(tensor)?;
        *self.tensor.lock().unwrap_or_else(|p| p.into_inner()) = Some(tensor.clone());
        Ok(())
    }

    /// Deregisters the tensor (collective). Later puts fail.
    pub fn tensor_deregister(&self) -> Result<()> {
        self.registered("tensor_deregister")?;
        let res = self.inner.deregister();
        *self.tensor.lock().unwrap_or_else(|p| p.into_inner()) = None;
        res
    }

    /// Writes `tensor` into `dst_rank`'s registered tensor at element `target_offset_nelems`
    /// (this rank's own too: a local copy, ordered with the rank's other window operations).
    pub fn put(
        &self,
        tensor: &Tensor,
        dst_rank: usize,
        target_offset_nelems: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let op = "put";
        if dst_rank >= self.size {
            return Err(Error::invalid(
                op,
                "dst_rank",
                format!("a rank in 0..{}", self.size),
                dst_rank,
            ));
        }
        let win = self.registered(op)?;
        if tensor.dtype() != win.dtype() {
            return Err(Error::invalid(
                op,
                "tensor",
                format!("a tensor of the window's dtype {}", win.dtype().name()),
                tensor.dtype().name(),
            ));
        }
        if !tensor.is_contiguous() {
            return Err(Error::invalid(
                op,
                "tensor",
                "a contiguous tensor",
                "a strided one",
            ));
        }
        let end = target_offset_nelems.checked_add(tensor.numel());
        if end.is_none_or(|e| e > win.numel()) {
            return Err(Error::invalid(
                op,
                "target_offset_nelems",
                format!("an offset with the tensor inside the window of {} elements", win.numel()),
                format!(
                    "target_offset_nelems + numel = {} exceeds the window of {} elements on rank {dst_rank}",
                    target_offset_nelems as u128 + tensor.numel() as u128,
                    win.numel()
                ),
            ));
        }
        if tensor.device() != win.device() {
            return Err(Error::invalid(
                op,
                "tensor",
                format!("a tensor on the window's device {}", win.device()),
                tensor.device(),
            ));
        }
        let offset = target_offset_nelems * win.dtype().size_bytes();
        self.inner.put(tensor, dst_rank, offset, opts)
    }

    /// Adds one to the signal counter `peer_rank` keeps for this rank, ordered after this
    /// rank's earlier puts to it.
    pub fn signal(&self, peer_rank: usize, opts: &OpOptions) -> Result<Work> {
        self.check_peer("signal", peer_rank)?;
        self.registered("signal")?;
        self.inner.signal(peer_rank, opts)
    }

    /// Waits for (and consumes) one signal from `peer_rank`.
    pub fn wait_signal(&self, peer_rank: usize, opts: &OpOptions) -> Result<Work> {
        self.check_peer("wait_signal", peer_rank)?;
        self.registered("wait_signal")?;
        self.inner.wait_signal(peer_rank, opts)
    }

    /// How `peer`'s window memory is reached: UNIFIED where it is mapped here (this rank's own;
    /// peers over NVLink), SEPARATE where only puts reach it.
    pub fn get_attr(&self, peer: usize) -> Result<WindowAttr> {
        if peer >= self.size {
            return Err(Error::invalid(
                "get_attr",
                "peer",
                format!("a rank in 0..{}", self.size),
                peer,
            ));
        }
        let mapped = peer == self.rank || self.inner.mapped_addr(peer).is_some();
        let access_type = if mapped {
            WinAccessType::Unified
        } else {
            WinAccessType::Separate
        };
        Ok(WindowAttr { access_type })
    }

    /// The address in this process of `rank`'s registered memory, where it is mapped here
    /// (UNIFIED access): what a tensor view of a peer's window is made over.
    pub fn map_remote(&self, rank: usize) -> Result<u64> {
        let win = self.registered("map_remote_tensor")?;
        if rank == self.rank {
            return Ok(win.addr() as u64);
        }
        self.inner.mapped_addr(rank).ok_or_else(|| {
            Error::invalid(
                "map_remote_tensor",
                "rank",
                format!(
                    "a rank whose window is mapped here (UNIFIED access: this rank, {}, or \
                     peers over NVLink)",
                    self.rank
                ),
                rank,
            )
        })
    }

    /// The registered tensor of this rank (`map_remote_tensor(rank)` for peers in Python
    /// builds a view over [`Window::map_remote`]).
    pub fn map_remote_tensor(&self, rank: usize) -> Result<Tensor> {
        if rank != self.rank {
            return Err(Error::invalid(
                "map_remote_tensor",
                "rank",
                format!(
                    "this rank ({}) (a peer's window with UNIFIED access is mapped through \
                     map_remote)",
                    self.rank
                ),
                rank,
            ));
        }
        self.registered("map_remote_tensor")
    }

    /// The backend's one-operation all-gather round (see [`WindowBackend::all_gather`]).
    pub(crate) fn fused_all_gather(
        &self,
        tensor: &Tensor,
        offset_bytes: usize,
        opts: &OpOptions,
    ) -> Option<Result<Work>> {
        self.inner.all_gather(tensor, offset_bytes, opts)
    }

    /// Bytes of the registered tensor (0 when none).
    pub fn get_size(&self) -> usize {
        self.registered("get_size").map_or(0, |t| t.nbytes())
    }

    /// Element type of the registered tensor.
    pub fn dtype(&self) -> Option<DataType> {
        self.registered("dtype").ok().map(|t| t.dtype())
    }

    /// Shape of the registered tensor (flat: its element count).
    pub fn shape(&self) -> Option<Vec<usize>> {
        self.registered("shape").ok().map(|t| vec![t.numel()])
    }

    /// Device of the registered tensor.
    pub fn device(&self) -> Option<Device> {
        self.registered("device").ok().map(|t| t.device())
    }
}
