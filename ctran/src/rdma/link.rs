//! One established connection: the TCP stream, a writer thread that owns its sending half
//! (requests, responses and their payloads leave in order and nothing else ever blocks on a
//! send), and a service thread that reads it, serving the peer's requests and completing this
//! side's.
//!
//! Every request waits on a deadline; a dead peer (EOF, reset) fails every pending and later
//! request with an error naming it.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::copy::{self, Mappings};
use super::error::{RdmaError, Result};
use super::ib_path::{IbPath, NotDirect, IB_CHUNK};
use super::key::AccessKey;
use super::peer_pid::owns_peer_end;
use super::registry::{Claim, MemDevice, Pin};
use super::wait::wait_for;
use super::wire::{Frame, Status, Via};

/// Something for the writer thread: a frame, and the range whose bytes follow it.
struct Outgoing {
    frame: Vec<u8>,
    payload: Option<Claim>,
}

/// What travels over the stream with a request besides its frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Payload {
    /// Nothing (the target copies by cross-memory attach or CUDA IPC).
    None,
    /// The local range follows the frame (a write over TCP).
    Send,
    /// The response carries the data for the local range (a read over TCP).
    Fill,
}

/// A request of this side waiting for its response.
struct Pending {
    op: &'static str,
    /// The local range (pinned until the response arrives, even after a timeout, since the
    /// peer may still copy into or out of it).
    _local: Arc<Pin>,
    /// Where a successful response's payload goes (a read over the stream).
    fill: Option<Claim>,
    /// Set when the response arrived.
    done: Option<std::result::Result<Status, String>>,
    /// The requester gave up (timeout): drop the entry when the response comes.
    abandoned: bool,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, Pending>,
    dead: Option<RdmaError>,
    /// Writes with notify=true that landed here and were not waited for yet.
    notifies: u64,
}

struct Shared {
    peer: String,
    state: Mutex<State>,
    changed: Condvar,
    /// The ib data path, when both sides opened one.
    ib: Option<Arc<IbPath>>,
}

/// How long the service thread waits for an RDMA write answering a read to complete.
const SERVE_WRITE_LIMIT: Duration = Duration::from_secs(60);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn kill(&self, detail: String) {
        let mut s = self.lock();
        if s.dead.is_none() {
            tracing::debug!(peer = %self.peer, "RDMA connection closed: {detail}");
            s.dead = Some(RdmaError::Disconnected {
                peer: self.peer.clone(),
                detail,
            });
        }
        s.pending.retain(|_, p| !p.abandoned);
        drop(s);
        self.changed.notify_all();
    }
}

/// An established connection (closed and joined on drop).
pub(crate) struct Link {
    shared: Arc<Shared>,
    out: Option<Sender<Outgoing>>,
    stream: TcpStream,
    next_req: AtomicU64,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("peer", &self.shared.peer)
            .finish()
    }
}

impl Link {
    /// Starts the threads of a connection to `peer` over `stream`.
    /// `first`: bytes the writer sends before any frame (the listener's acknowledgement).
    pub(crate) fn start(
        stream: TcpStream,
        peer: String,
        first: Option<Vec<u8>>,
        ib: Option<Arc<IbPath>>,
    ) -> Result<Link> {
        let io_err = |e: std::io::Error| RdmaError::Io {
            op: "starting the connection",
            peer: peer.clone(),
            detail: e.to_string(),
        };
        stream.set_read_timeout(None).map_err(io_err)?;
        stream.set_write_timeout(None).map_err(io_err)?;
        let _ = stream.set_nodelay(true);
        let shared = Arc::new(Shared {
            peer: peer.clone(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            ib,
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        if let Some(frame) = first {
            let _ = tx.send(Outgoing {
                frame,
                payload: None,
            });
        }
        let w = stream.try_clone().map_err(io_err)?;
        let r = stream.try_clone().map_err(io_err)?;
        let sh = Arc::clone(&shared);
        let writer = std::thread::Builder::new()
            .name("tc-rdma-send".into())
            .spawn(move || send_loop(w, rx, sh))
            .map_err(io_err)?;
        let sh = Arc::clone(&shared);
        let tx2 = tx.clone();
        let service = std::thread::Builder::new()
            .name("tc-rdma-serve".into())
            .spawn(move || serve_loop(r, tx2, sh))
            .map_err(io_err)?;
        Ok(Link {
            shared,
            out: Some(tx),
            stream,
            next_req: AtomicU64::new(1),
            threads: vec![service, writer],
        })
    }

    /// Whether the connection is still up.
    pub(crate) fn is_alive(&self) -> bool {
        self.shared.lock().dead.is_none()
    }

    /// Sends a request built by `frame` (given its id) and waits for its response until
    /// `deadline` (`limit` after the call started). `payload`: whether `local` streams after
    /// the frame or the response's payload fills it.
    pub(crate) fn request(
        &self,
        op: &'static str,
        frame: impl FnOnce(u64) -> Frame,
        local: Arc<Pin>,
        payload: Payload,
        (deadline, limit): (Instant, Duration),
    ) -> Result<Status> {
        let req = self.next_req.fetch_add(1, Ordering::Relaxed);
        let mut s = self.shared.lock();
        if let Some(e) = &s.dead {
            return Err(e.clone());
        }
        s.pending.insert(
            req,
            Pending {
                op,
                fill: (payload == Payload::Fill).then(|| local.claim()),
                _local: Arc::clone(&local),
                done: None,
                abandoned: false,
            },
        );
        drop(s);
        let out = Outgoing {
            frame: frame(req).encode(),
            payload: (payload == Payload::Send).then(|| local.claim()),
        };
        drop(local);
        let sent = self.out.as_ref().is_some_and(|tx| tx.send(out).is_ok());
        let mut s = self.shared.lock();
        if !sent {
            s.pending.remove(&req);
            return Err(s.dead.clone().unwrap_or_else(|| RdmaError::Disconnected {
                peer: self.shared.peer.clone(),
                detail: "the connection is closing".into(),
            }));
        }
        let peer = &self.shared.peer;
        let (mut s, outcome) = wait_for(&self.shared.changed, s, deadline, |s| {
            if let Some(done) = s.pending.get_mut(&req).and_then(|p| p.done.take()) {
                s.pending.remove(&req);
                return Some(done.map_err(|detail| RdmaError::Remote {
                    op,
                    peer: peer.clone(),
                    detail,
                }));
            }
            let dead = s.dead.clone()?;
            s.pending.remove(&req);
            Some(Err(dead))
        });
        outcome.unwrap_or_else(|| {
            if let Some(p) = s.pending.get_mut(&req) {
                p.abandoned = true;
            }
            Err(RdmaError::Timeout {
                op,
                after: limit,
                peer: peer.clone(),
            })
        })
    }

    /// Consumes one notification of a peer's write, waiting until `deadline`.
    pub(crate) fn wait_notify(&self, deadline: Instant, limit: Duration) -> Result<()> {
        let s = self.shared.lock();
        let (_s, outcome) = wait_for(&self.shared.changed, s, deadline, |s| {
            if s.notifies > 0 {
                s.notifies -= 1;
                return Some(Ok(()));
            }
            s.dead.clone().map(Err)
        });
        outcome.unwrap_or_else(|| {
            Err(RdmaError::Timeout {
                op: "wait_for_write",
                after: limit,
                peer: self.shared.peer.clone(),
            })
        })
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.kill("closed by this side".into());
        let _ = self.stream.shutdown(Shutdown::Both);
        // The service thread holds a sender too; it ends on the shutdown, then the writer on
        // the closed channel.
        self.out = None;
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("an RDMA connection thread panicked");
            }
        }
    }
}

fn send_loop(mut w: TcpStream, rx: Receiver<Outgoing>, shared: Arc<Shared>) {
    while let Ok(out) = rx.recv() {
        let r = w
            .write_all(&out.frame)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                match &out.payload {
                    None => Ok(()),
                    // A chunk that cannot be read went as zeros, and the trailer says so.
                    Some(claim) => copy::send_from(claim, &mut w)
                        .map(|read| {
                            if let Err(e) = read {
                                tracing::warn!("an RDMA payload went incomplete: {e}");
                            }
                        })
                        .map_err(|e| e.to_string()),
                }
            });
        if let Err(e) = r {
            let _ = w.shutdown(Shutdown::Both);
            shared.kill(format!("sending: {e}"));
            return;
        }
    }
}

fn respond(tx: &Sender<Outgoing>, req: u64, r: Result<()>) {
    let (status, text) = match r {
        Ok(()) => (Status::Ok, String::new()),
        Err(e) => (Status::Failed, e.to_string()),
    };
    send_response(tx, req, status, text, None);
}

fn send_response(
    tx: &Sender<Outgoing>,
    req: u64,
    status: Status,
    text: String,
    payload: Option<Claim>,
) {
    let frame = Frame::Response {
        req,
        status,
        text,
        payload: payload.as_ref().map_or(0, |c| c.len),
    };
    let _ = tx.send(Outgoing {
        frame: frame.encode(),
        payload,
    });
}

/// The error of a check, the pin itself released (a payload pins chunk by chunk).
fn drop_pin_keep_error(pin: Result<Pin>) -> Result<()> {
    pin.map(drop)
}

/// Validates a peer's request: its key, then pins the range.
fn target(key: &str, addr: u64, len: u64) -> Result<Pin> {
    let key = AccessKey::parse(key)?;
    Pin::remote(&key, addr, len)
}

fn need(pin: &Pin, want: MemDevice, path: &str) -> Result<()> {
    let ok = match want {
        MemDevice::Cpu => pin.device == MemDevice::Cpu,
        MemDevice::Cuda(_) => matches!(pin.device, MemDevice::Cuda(_)),
    };
    if ok {
        Ok(())
    } else {
        Err(RdmaError::InvalidArgument {
            arg: "remote",
            detail: format!("a {path} request for memory on {}", pin.device),
        })
    }
}

/// The request id and the pid a request claims to come from, for the paths where the target
/// copies straight from or to the requester's memory (cross-memory attach, one process).
fn process_claim(frame: &Frame) -> Option<(u64, u32)> {
    let (req, via) = match frame {
        Frame::Write { req, via, .. } | Frame::Read { req, via, .. } => (*req, via),
        Frame::Response { .. } => return None,
    };
    match via {
        Via::Cma { pid, .. } => Some((req, *pid)),
        Via::Local { .. } => Some((req, std::process::id())),
        Via::Payload | Via::Ipc { .. } | Via::Ib | Via::IbDirect { .. } => None,
    }
}

fn serve_loop(stream: TcpStream, tx: Sender<Outgoing>, shared: Arc<Shared>) {
    let mut r = BufReader::with_capacity(256 * 1024, stream);
    let mut maps = Mappings::default();
    // Whether the pids that cross-memory requests named hold the peer's end.
    let mut pids: HashMap<u32, bool> = HashMap::new();
    let e = loop {
        let frame = match Frame::recv(&mut r) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break "peer closed the connection (EOF)".to_string()
            }
            Err(e) => break format!("receiving: {e}"),
        };
        if let Some((req, pid)) = process_claim(&frame) {
            if !*pids
                .entry(pid)
                .or_insert_with(|| owns_peer_end(r.get_ref(), pid))
            {
                let why = format!(
                    "pid {pid} does not hold the other end of this connection; a direct copy \
                     from or to its memory is refused"
                );
                send_response(&tx, req, Status::CmaDenied, why, None);
                continue;
            }
        }
        let step = match frame {
            Frame::Write {
                req,
                key,
                dst,
                len,
                notify,
                via,
            } => serve_write(
                &mut r, &tx, &shared, &mut maps, req, &key, dst, len, notify, via,
            ),
            Frame::Read {
                req,
                key,
                src,
                len,
                via,
            } => {
                serve_read(&tx, &shared, &mut maps, req, &key, src, len, via);
                Ok(())
            }
            Frame::Response {
                req,
                status,
                text,
                payload,
            } => complete(&mut r, &shared, req, status, text, payload),
        };
        if let Err(e) = step {
            break e;
        }
    };
    shared.kill(e);
}

#[allow(clippy::too_many_arguments)]
fn serve_write(
    r: &mut BufReader<TcpStream>,
    tx: &Sender<Outgoing>,
    shared: &Shared,
    maps: &mut Mappings,
    req: u64,
    key: &str,
    dst: u64,
    len: u64,
    notify: bool,
    via: Via,
) -> std::result::Result<(), String> {
    let pin = target(key, dst, len);
    let result = match via {
        Via::Ib => pin.and_then(|p| {
            let ib = ib_of(shared, p.len)?;
            let mut buf = vec![0u8; p.len as usize];
            ib.take_write(&mut buf);
            copy::write_pin(&p, &buf)
        }),
        Via::IbDirect { key } => match serve_in_place(tx, shared, req, pin, key, true) {
            Some(r) => r,
            None => return Ok(()),
        },
        Via::Payload => {
            // Checked now; each chunk pins its part again as it arrives.
            let claim = pin.as_ref().map(Pin::claim).ok();
            drop_pin_keep_error(pin).and(
                copy::recv_into(claim.as_ref(), len, r)
                    .map_err(|e| format!("receiving a payload: {e}"))?,
            )
        }
        direct => match direct_copy(tx, req, pin, direct, maps, true) {
            Some(r) => r,
            None => return Ok(()),
        },
    };
    if result.is_ok() && notify {
        shared.lock().notifies += 1;
        shared.changed.notify_all();
    }
    respond(tx, req, result);
    Ok(())
}

/// The ib data path of this connection, for a request that names it (at most one chunk).
fn ib_of(shared: &Shared, len: u64) -> Result<&IbPath> {
    if len > IB_CHUNK as u64 {
        return Err(RdmaError::InvalidArgument {
            arg: "len",
            detail: format!("at most {IB_CHUNK} bytes per ib request, got {len}"),
        });
    }
    ib_path(shared)
}

/// A transfer in place over ib: the target moves the pinned range from or into the
/// requester's registered range `key`. `None` when the target cannot register its memory and
/// told the requester to stage.
fn serve_in_place(
    tx: &Sender<Outgoing>,
    shared: &Shared,
    req: u64,
    pin: Result<Pin>,
    key: ibverbx::RemoteKey,
    into_pin: bool,
) -> Option<Result<()>> {
    let (ib, p) = match pin.and_then(|p| Ok((ib_path(shared)?, p))) {
        Ok(x) => x,
        Err(e) => return Some(Err(e)),
    };
    match ib.serve_direct(&p, key, into_pin, Instant::now() + SERVE_WRITE_LIMIT) {
        Ok(()) => Some(Ok(())),
        Err(NotDirect::Failed(e)) => Some(Err(e)),
        Err(NotDirect::Unavailable(why)) => {
            send_response(tx, req, Status::NoDirect, why, None);
            None
        }
    }
}

fn ib_path(shared: &Shared) -> Result<&IbPath> {
    shared
        .ib
        .as_deref()
        .ok_or_else(|| RdmaError::InvalidArgument {
            arg: "via",
            detail: "ib, but this side has no ib data path (TORCHCOMMS_RDMA_PATH=ib on both)"
                .into(),
        })
}

/// A copy straight between the pinned range and the requester's memory (cross-memory attach,
/// same process, CUDA IPC); `into_pin`: a write. `None` when cross-memory attach was refused
/// by the kernel and the requester was told to fall back to the stream.
fn direct_copy(
    tx: &Sender<Outgoing>,
    req: u64,
    pin: Result<Pin>,
    via: Via,
    maps: &mut Mappings,
    into_pin: bool,
) -> Option<Result<()>> {
    Some(match via {
        Via::Payload | Via::Ib | Via::IbDirect { .. } => Err(RdmaError::InvalidArgument {
            arg: "via",
            detail: "a payload or ib transfer is not a direct copy".into(),
        }),
        Via::Cma { pid, addr } => {
            let p = match pin.and_then(|p| need(&p, MemDevice::Cpu, "cross-memory").map(|()| p)) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            let copied = if into_pin {
                copy::cma_pull(pid, addr, &p)
            } else {
                copy::cma_push(pid, addr, &p)
            };
            match copied {
                Err(e) if copy::cma_denied(&e) => {
                    send_response(tx, req, Status::CmaDenied, e.to_string(), None);
                    return None;
                }
                r => r.map_err(|e| RdmaError::Cma {
                    pid,
                    detail: e.to_string(),
                }),
            }
        }
        Via::Local { addr } => pin
            .and_then(|p| need(&p, MemDevice::Cuda(0), "same-process").map(|()| p))
            .and_then(|p| copy::local_copy(&p, addr, into_pin)),
        Via::Ipc {
            handle,
            buffer_id,
            offset,
        } => pin
            .and_then(|p| need(&p, MemDevice::Cuda(0), "CUDA IPC").map(|()| p))
            .and_then(|p| maps.copy(&p, &handle, buffer_id, offset, into_pin)),
    })
}

#[allow(clippy::too_many_arguments)]
fn serve_read(
    tx: &Sender<Outgoing>,
    shared: &Shared,
    maps: &mut Mappings,
    req: u64,
    key: &str,
    src: u64,
    len: u64,
    via: Via,
) {
    let pin = target(key, src, len);
    let result = match via {
        Via::Ib => pin.and_then(|p| {
            let ib = ib_of(shared, p.len)?;
            let mut buf = vec![0u8; p.len as usize];
            copy::read_pin(&p, &mut buf)?;
            ib.push_read(&buf, Instant::now() + SERVE_WRITE_LIMIT)
        }),
        Via::IbDirect { key } => match serve_in_place(tx, shared, req, pin, key, false) {
            Some(r) => r,
            None => return,
        },
        Via::Payload => match pin {
            Ok(p) => {
                send_response(tx, req, Status::Ok, String::new(), Some(p.claim()));
                return;
            }
            Err(e) => Err(e),
        },
        direct => match direct_copy(tx, req, pin, direct, maps, false) {
            Some(r) => r,
            None => return,
        },
    };
    respond(tx, req, result);
}

/// Completes this side's request `req` with the peer's response (and its payload).
fn complete(
    r: &mut BufReader<TcpStream>,
    shared: &Shared,
    req: u64,
    status: Status,
    text: String,
    payload: u64,
) -> std::result::Result<(), String> {
    let dest = {
        let s = shared.lock();
        s.pending
            .get(&req)
            .filter(|_| status == Status::Ok)
            .and_then(|p| p.fill)
    };
    let mut outcome = match status {
        Status::Failed => Err(text),
        s => Ok(s),
    };
    if payload > 0 {
        let dest = dest.filter(|d| d.len == payload);
        if let Err(e) = copy::recv_into(dest.as_ref(), payload, r)
            .map_err(|e| format!("receiving a payload: {e}"))?
        {
            outcome = Err(format!("copying the payload into local memory: {e}"));
        }
    }
    let mut s = shared.lock();
    match s.pending.get_mut(&req) {
        Some(p) if p.abandoned => {
            s.pending.remove(&req);
        }
        Some(p) => {
            tracing::trace!(op = p.op, req, "RDMA request completed");
            p.done = Some(outcome);
        }
        None => tracing::debug!(req, "response to an unknown request"),
    }
    drop(s);
    shared.changed.notify_all();
    Ok(())
}
