//! One-sided windows on a communicator (CPU memory): a buffer every rank registers
//! collectively, into which peers `put` data and `signal`, and on which a rank `wait_signal`s
//! for a peer's signals.
//!
//! - Registration ([`Window::register`]) registers the buffer with the transports
//!   ([`crate::transport::Transport::register_region`]) and exchanges the keys with the
//!   communicator's all_gather; ranks that registered different sizes all fail, naming both.
//! - A put writes into the peer's registered buffer at a byte offset (cross-memory attach to a
//!   local peer where it works, a put frame over TCP otherwise); a signal adds one to the counter
//!   the peer keeps for this rank and follows this rank's earlier puts to it; a wait consumes one
//!   signal of a peer (it waits until that peer's counter reaches the number of waits so far).
//! - Deregistration is collective: every rank fences every peer, so every put and signal sent
//!   before it has arrived, and then forgets the region; later puts fail here, and a frame that
//!   names a stale region is refused by its target.
//!
//! Every operation runs on the progress thread in issue order with the communicator's timeout;
//! after the communicator failed or was finalized they return its error.
//!
//! GPU memory is registered staged ([`Window::register_staged`], [`staged::DeviceSink`]): its
//! operations are built with [`Window::put_op`] and the others and run through the GPU progress
//! engine in stream order.

mod exec;
pub mod op;
pub mod staged;

use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) use exec::{run, Outcome, WinCtx};
pub use op::WindowOp;

use crate::comm::{Comm, KeepAlive, Op, Request};
use crate::error::{Error, Result};
use crate::gpe::DeviceLanding;
use crate::span::Span;
use crate::transport::region::comm_id;
use crate::transport::{RegionId, RegionSink, RemoteKey};
use staged::DeviceSink;

/// A registration of a window: the local region, every rank's key, and the waits so far.
#[derive(Debug)]
struct Registered {
    region: RegionId,
    /// This rank's memory (a put to this rank copies into it): the registered host memory, or
    /// the device memory of a staged window.
    buf: Span,
    keys: Vec<RemoteKey>,
    /// Waits issued per peer (a wait targets this count).
    waits: Vec<u64>,
    /// A staged window's sink (GPU memory over host transports).
    staged: Option<Arc<DeviceSink>>,
    /// The owner of the memory, held until deregistration.
    _keep: KeepAlive,
}

/// A window of a communicator. Create one per buffer; every rank calls
/// [`Window::register`] and [`Window::deregister`] in the same order as its collectives.
#[derive(Debug)]
pub struct Window {
    comm: Arc<Comm>,
    state: Mutex<Option<Registered>>,
}

impl Window {
    /// A window of `comm` with no memory registered yet.
    pub fn new(comm: Arc<Comm>) -> Window {
        Window {
            comm,
            state: Mutex::new(None),
        }
    }

    /// The communicator.
    pub fn comm(&self) -> &Arc<Comm> {
        &self.comm
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Option<Registered>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether memory is registered.
    pub fn is_registered(&self) -> bool {
        self.state().is_some()
    }

    /// Bytes of `rank`'s registered memory, when registered.
    pub fn size_of(&self, rank: usize) -> Option<usize> {
        self.state()
            .as_ref()
            .and_then(|r| r.keys.get(rank))
            .map(|k| k.len as usize)
    }

    /// Registers `buf` (collective: every rank calls it). `keep` owns the memory and is held
    /// until [`Window::deregister`]; the memory must stay valid that long. Fails on every rank
    /// when ranks registered different sizes, naming both.
    pub fn register(&self, buf: Span, keep: KeepAlive, timeout: Option<Duration>) -> Result<()> {
        self.register_region(buf, buf, None, keep, timeout)
    }

    /// Registers GPU memory `buf` that peers reach over host transports, as [`Window::register`]
    /// does host memory: puts land in the sink's staging, and a wait for a peer's signal lands
    /// the bytes it covers in `buf` on the device ([`staged`]). The window's operations then
    /// run through the GPU progress engine ([`Window::put_op`] and the others).
    pub fn register_staged(
        &self,
        buf: Span,
        sink: Arc<DeviceSink>,
        keep: KeepAlive,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let staging = sink.staging();
        if staging.len() != buf.len() {
            return Err(Error::invalid(
                "staging",
                format!("{} bytes of staging (the window's size)", buf.len()),
                staging.len(),
            ));
        }
        self.register_region(buf, staging, Some(sink), keep, timeout)
    }

    /// Registers `exposed` with the transports (`buf` itself, or a staged window's staging);
    /// local puts write `buf`.
    fn register_region(
        &self,
        buf: Span,
        exposed: Span,
        staged: Option<Arc<DeviceSink>>,
        keep: KeepAlive,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let mut state = self.state();
        if state.is_some() {
            return Err(Error::invalid(
                "tensor",
                "a window without registered memory (call tensor_deregister first)",
                "a window that already has a tensor registered",
            ));
        }
        let mut key = [0u8; RemoteKey::LEN];
        // SAFETY: `key` lives on this frame until `run` returns, after the operation finished.
        let key_out = unsafe { Span::from_slice(&mut key) };
        let register = WindowOp::Register {
            buf: exposed,
            key_out,
            sink: staged.clone().map(|s| s as Arc<dyn RegionSink>),
        };
        self.comm.run(Op::Window(register), timeout)?;
        let mine = RemoteKey::from_bytes(&key).expect("a key is LEN bytes");
        let region = RegionId(mine.id);
        let gathered = match self.comm.all_gather_bytes(&key, timeout) {
            Ok(g) => g,
            Err(e) => {
                let _ = self.forget(region, timeout);
                return Err(e);
            }
        };
        let keys: Vec<RemoteKey> = gathered
            .chunks(RemoteKey::LEN)
            .map(|c| RemoteKey::from_bytes(c).expect("a key is LEN bytes"))
            .collect();
        let me = self.comm.rank();
        if let Some(other) = keys.iter().find(|k| k.len != mine.len) {
            let _ = self.forget(region, timeout);
            return Err(Error::invalid(
                "tensor",
                format!(
                    "a window of the same size on every rank (rank {me} registered {} bytes)",
                    mine.len
                ),
                format!("rank {} registered {} bytes", other.rank, other.len),
            ));
        }
        let comm = comm_id(self.comm.name());
        if let Some(k) = keys
            .iter()
            .enumerate()
            .find(|(r, k)| k.comm != comm || k.rank as usize != *r)
        {
            let _ = self.forget(region, timeout);
            return Err(Error::invalid(
                "window key",
                format!("the key of rank {} of this communicator", k.0),
                format!("a key of rank {}", k.1.rank),
            ));
        }
        *state = Some(Registered {
            region,
            buf,
            waits: vec![0; keys.len()],
            keys,
            staged,
            _keep: keep,
        });
        Ok(())
    }

    fn forget(&self, region: RegionId, timeout: Option<Duration>) -> Result<()> {
        self.comm
            .run(Op::Window(WindowOp::Forget { region }), timeout)
    }

    /// Deregisters the memory (collective). Every put and signal issued before it, on any
    /// rank, has arrived when it returns; the memory's owner is released.
    pub fn deregister(&self, timeout: Option<Duration>) -> Result<()> {
        let mut state = self.state();
        let Some(reg) = state.take() else {
            return Err(not_registered("tensor_deregister"));
        };
        self.comm.run(
            Op::Window(WindowOp::Deregister {
                region: reg.region,
                keys: reg.keys.clone(),
            }),
            timeout,
        )
    }

    /// A put to this rank: a copy into its own memory, in issue order with its other puts.
    fn local_put_op(&self, src: Span, offset: usize) -> Result<Op> {
        let dst = match self.state().as_ref() {
            Some(reg) => reg.buf,
            None => return Err(not_registered("window_put")),
        };
        if offset
            .checked_add(src.len())
            .is_none_or(|end| end > dst.len())
        {
            return Err(Error::invalid(
                "target_offset",
                "a write inside the window",
                format!(
                    "a write of {} bytes at offset {offset} exceeds this rank's window of {} bytes",
                    src.len(),
                    dst.len()
                ),
            ));
        }
        Ok(Op::Window(WindowOp::LocalPut {
            src,
            dst: dst.sub(offset, src.len()),
        }))
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        let size = self.comm.size();
        let me = self.comm.rank();
        if peer >= size || peer == me {
            return Err(Error::invalid(
                "peer",
                format!("another rank of the communicator (0..{size}, not {me})"),
                peer,
            ));
        }
        Ok(())
    }

    /// The operation that writes `src` into `peer`'s registered memory at byte `offset` (this
    /// rank's own too: a local copy), checked. [`Window::put`] submits it to the communicator;
    /// a staged window's goes through the GPU progress engine.
    pub fn put_op(&self, src: Span, peer: usize, offset: usize) -> Result<Op> {
        if peer == self.comm.rank() {
            return self.local_put_op(src, offset);
        }
        let key = self.key_for("window_put", peer)?;
        key.check_fits(offset as u64, src.len() as u64)
            .map_err(|why| Error::invalid("target_offset", "a write inside the window", why))?;
        Ok(Op::Window(WindowOp::Put {
            src,
            peer,
            key,
            offset: offset as u64,
        }))
    }

    /// The operation that adds one to the counter `peer` keeps for this rank (see
    /// [`Window::put_op`]).
    pub fn signal_op(&self, peer: usize) -> Result<Op> {
        let key = self.key_for("window_signal", peer)?;
        Ok(Op::Window(WindowOp::Signal { peer, key }))
    }

    /// The operation that consumes one signal of `peer` (see [`Window::put_op`]), and on a
    /// staged window the copy the device makes once it passed. Counts the wait: issue every
    /// operation it returns.
    pub fn wait_signal_op(&self, peer: usize) -> Result<(Op, Option<DeviceLanding>)> {
        let name = "window_wait_signal";
        self.check_peer(peer)?;
        let mut state = self.state();
        let reg = state.as_mut().ok_or_else(|| not_registered(name))?;
        reg.waits[peer] += 1;
        let (staged, landing) = match &reg.staged {
            Some(sink) => {
                let (wait, landing) = sink.next_wait();
                (Some(wait), Some(landing))
            }
            None => (None, None),
        };
        let op = Op::Window(WindowOp::WaitSignal {
            region: reg.region,
            peer,
            target: reg.waits[peer],
            staged,
        });
        Ok((op, landing))
    }

    /// Writes `src` (owned by `keep`) into `peer`'s registered memory at byte `offset` (this
    /// rank's own too: a local copy).
    pub fn put(
        &self,
        src: Span,
        keep: KeepAlive,
        peer: usize,
        offset: usize,
        timeout: Option<Duration>,
    ) -> Request {
        match self.put_op(src, peer, offset) {
            Ok(op) => self.comm.submit_with(op, timeout, keep),
            Err(e) => failed("window_put", e),
        }
    }

    /// Adds one to the counter `peer` keeps for this rank, after this rank's earlier puts.
    pub fn signal(&self, peer: usize, timeout: Option<Duration>) -> Request {
        match self.signal_op(peer) {
            Ok(op) => self.comm.submit(op, timeout),
            Err(e) => failed("window_signal", e),
        }
    }

    /// Consumes one signal of `peer`: waits until its counter reaches the waits so far + 1.
    pub fn wait_signal(&self, peer: usize, timeout: Option<Duration>) -> Request {
        match self.wait_signal_op(peer) {
            Ok((op, _)) => self.comm.submit(op, timeout),
            Err(e) => failed("window_wait_signal", e),
        }
    }

    fn key_for(&self, name: &str, peer: usize) -> Result<RemoteKey> {
        self.check_peer(peer)?;
        let state = self.state();
        let reg = state.as_ref().ok_or_else(|| not_registered(name))?;
        Ok(reg.keys[peer])
    }
}

impl Drop for Window {
    /// A window dropped while registered forgets its region locally (peers are not told: call
    /// [`Window::deregister`] first); the memory's owner is released only after the progress
    /// thread forgot the region, so no frame can write into freed memory.
    fn drop(&mut self) {
        let reg = self
            .state
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(reg) = reg {
            tracing::warn!(
                comm = %self.comm.name(),
                rank = self.comm.rank(),
                "a window was dropped while registered; it is forgotten locally (deregister it \
                 collectively first, or peers' later puts fail)"
            );
            let op = Op::Window(WindowOp::Forget { region: reg.region });
            drop(self.comm.submit_with(op, None, reg._keep));
        }
    }
}

fn failed(name: &'static str, e: Error) -> Request {
    Request::failed(name, 0, e)
}

fn not_registered(what: &str) -> Error {
    Error::invalid(
        "window",
        format!("a window with a registered tensor for {what} (call tensor_register first)"),
        "a window without one (never registered, or deregistered)",
    )
}
