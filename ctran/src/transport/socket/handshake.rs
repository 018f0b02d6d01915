//! The handshake of one transport connection: a mutual HMAC challenge-response under the
//! communicator's key, run as a non-blocking state machine so that a listener serves many
//! handshakes at once and a silent connection delays nobody.
//!
//! ```text
//! connector -> acceptor  HELLO      magic, version, from, to, mode, client nonce (64 bytes)
//! acceptor  -> connector CHALLENGE  server nonce, HMAC(key, "server", HELLO, server nonce,
//!                                   mode), mode (68 bytes)
//! connector -> acceptor  PROOF      HMAC(key, "client", HELLO, server nonce)
//! acceptor  -> connector ACK        1
//! ```
//!
//! Both sides contribute a fresh random nonce, so neither proof can be replayed, and the key
//! itself never crosses the wire. The connector checks the acceptor's proof before it proves
//! anything, so a process that took over a rank's address learns nothing it could relay
//! later. Every read asks for at most the bytes the current message still needs: whatever a
//! peer sends, nothing is buffered beyond 68 bytes.
//!
//! Each side names its data protection (`TORCHCOMMS_DATA_PROTECTION`) inside what the proofs
//! cover, so no one on the path can downgrade it. When they differ, both fail init, each once
//! the other proved the key (a stranger cannot make a rank fail this way): the connector after
//! the acceptor's proof, the acceptor after the connector's. The transcript (HELLO and the
//! server nonce) then keys the connection's data path ([`protect`](super::protect)).

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::Instant;

use nix::poll::PollFlags;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use torchcomms_core::bootstrap::auth::{mac, verify_mac};

use super::mesh::MeshPlan;
use super::protect::{self, Protection, Session};

const HELLO_MAGIC: &[u8; 8] = b"TCRSHEL3";
const HELLO_VERSION: u32 = 3;
pub(crate) const HELLO_LEN: usize = 64;
/// Where HELLO holds the connector's data protection ([`Protection`]'s code).
const HELLO_MODE: usize = 20;
const CHALLENGE_LEN: usize = 68;
const PROOF_LEN: usize = 32;
const SERVER_LABEL: &[u8] = b"torchcomms-rs mesh server proof v3";
const CLIENT_LABEL: &[u8] = b"torchcomms-rs mesh client proof v3";

/// Where a handshake stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Connector: the TCP connection is being established.
    Connecting,
    /// Connector: HELLO sent, waiting for the acceptor's proof.
    AwaitChallenge,
    /// Connector: proof sent, waiting for the acceptor's verdict.
    AwaitAck,
    /// Acceptor: waiting for HELLO.
    AwaitHello,
    /// Acceptor: challenge sent, waiting for the connector's proof.
    AwaitProof,
    /// Acceptor: ACK queued, done once it is written.
    SendingAck,
}

/// What an event did to a handshake.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Still going.
    Pending,
    /// Authenticated: the peer's rank.
    Done(usize),
    /// Acceptor: the connection is refused (logged; the mesh goes on).
    Refused(String),
    /// Connector: this attempt failed in a way that may pass (refused, closed); try again.
    Retry(String),
    /// Connector: the peer could not prove it holds the key: init fails.
    Fatal(String),
}

/// One connection being authenticated.
#[derive(Debug)]
pub(super) struct Shake {
    pub(super) sock: Socket,
    /// Who is at the other end (for messages).
    pub(super) addr: String,
    /// When this handshake gives up.
    pub(super) deadline: Instant,
    stage: Stage,
    /// The rank at the other end: known to the connector from the start, to the acceptor once
    /// HELLO arrived.
    peer: Option<usize>,
    inbuf: Vec<u8>,
    want: usize,
    out: Vec<u8>,
    out_pos: usize,
    hello: [u8; HELLO_LEN],
    server_nonce: [u8; 32],
    /// Connector: the acceptor proved the key but uses another data protection; init fails
    /// with this once the acceptor learned it too.
    mismatch: Option<String>,
}

impl Shake {
    /// Starts connecting to `peer` at `addr` (non-blocking).
    pub(super) fn connect(
        plan: &MeshPlan,
        peer: usize,
        addr: SocketAddr,
        deadline: Instant,
    ) -> io::Result<Shake> {
        let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        sock.set_cloexec(true)?;
        sock.set_nonblocking(true)?;
        match sock.connect(&SockAddr::from(addr)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
            Err(e) => return Err(e),
        }
        let mut hello = [0u8; HELLO_LEN];
        hello[..8].copy_from_slice(HELLO_MAGIC);
        hello[8..12].copy_from_slice(&HELLO_VERSION.to_le_bytes());
        hello[12..16].copy_from_slice(&(plan.rank as u32).to_le_bytes());
        hello[16..20].copy_from_slice(&(peer as u32).to_le_bytes());
        hello[HELLO_MODE..HELLO_MODE + 4].copy_from_slice(&plan.protection.code().to_le_bytes());
        hello[32..64].copy_from_slice(&rand::random::<[u8; 32]>());
        Ok(Shake {
            sock,
            addr: addr.to_string(),
            deadline,
            stage: Stage::Connecting,
            peer: Some(peer),
            inbuf: Vec::with_capacity(CHALLENGE_LEN),
            want: CHALLENGE_LEN,
            out: Vec::new(),
            out_pos: 0,
            hello,
            server_nonce: [0; 32],
            mismatch: None,
        })
    }

    /// Takes an accepted connection.
    pub(super) fn accept(sock: Socket, addr: String, deadline: Instant) -> io::Result<Shake> {
        sock.set_nonblocking(true)?;
        Ok(Shake {
            sock,
            addr,
            deadline,
            stage: Stage::AwaitHello,
            peer: None,
            inbuf: Vec::with_capacity(HELLO_LEN),
            want: HELLO_LEN,
            out: Vec::new(),
            out_pos: 0,
            hello: [0; HELLO_LEN],
            server_nonce: [0; 32],
            mismatch: None,
        })
    }

    /// The events to wait for.
    pub(super) fn interest(&self) -> PollFlags {
        if self.stage == Stage::Connecting || self.out_pos < self.out.len() {
            PollFlags::POLLOUT
        } else {
            PollFlags::POLLIN
        }
    }

    /// Moves the handshake on after `revents`. `connected[r]`: rank `r` is connected already.
    pub(super) fn on_event(
        &mut self,
        revents: PollFlags,
        plan: &MeshPlan,
        connected: &[bool],
    ) -> Outcome {
        match self.step(revents, plan, connected) {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Outcome::Pending,
            Err(e) => match self.mismatch.take() {
                // The acceptor closes once it found the modes differ.
                Some(why) => Outcome::Fatal(why),
                None => self.broken(format!("{e}")),
            },
        }
    }

    /// The keys of the data path of a connection whose handshake is done (`None` when
    /// unprotected). Rank `i` connects to every rank above it, so the higher end connected.
    pub(super) fn session(&self, plan: &MeshPlan) -> Option<Session> {
        let connector = self.peer.is_some_and(|p| p > plan.rank);
        protect::session(
            plan.protection,
            &plan.key,
            &self.hello,
            &self.server_nonce,
            connector,
        )
    }

    /// A connection that failed at the transport level (reset, closed, refused).
    fn broken(&self, why: String) -> Outcome {
        match self.stage {
            Stage::Connecting | Stage::AwaitChallenge | Stage::AwaitAck => Outcome::Retry(why),
            Stage::AwaitProof => Outcome::Refused(format!(
                "{why} before proving the job key (a peer that holds another key closes here)"
            )),
            Stage::AwaitHello | Stage::SendingAck => Outcome::Refused(why),
        }
    }

    fn step(
        &mut self,
        revents: PollFlags,
        plan: &MeshPlan,
        connected: &[bool],
    ) -> io::Result<Outcome> {
        if self.stage == Stage::Connecting {
            if !revents.intersects(PollFlags::POLLOUT | PollFlags::POLLERR | PollFlags::POLLHUP) {
                return Ok(Outcome::Pending);
            }
            if let Some(e) = self.sock.take_error()? {
                return Err(e);
            }
            self.out.extend_from_slice(&self.hello);
            self.stage = Stage::AwaitChallenge;
        }
        self.flush()?;
        if self.stage == Stage::SendingAck {
            return Ok(if self.out_pos == self.out.len() {
                Outcome::Done(self.peer.expect("known after HELLO"))
            } else {
                Outcome::Pending
            });
        }
        // Read no more than the message in progress needs.
        while self.inbuf.len() < self.want {
            let mut chunk = [0u8; CHALLENGE_LEN];
            let n = (&self.sock).read(&mut chunk[..self.want - self.inbuf.len()])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed",
                ));
            }
            self.inbuf.extend_from_slice(&chunk[..n]);
            // A stray client is turned away on its first bytes, not after 64 of them.
            if self.stage == Stage::AwaitHello
                && self.inbuf.len() >= HELLO_MAGIC.len()
                && &self.inbuf[..HELLO_MAGIC.len()] != HELLO_MAGIC
            {
                return Ok(Outcome::Refused(
                    "not a torchcomms-rs peer (bad magic)".into(),
                ));
            }
        }
        let msg = std::mem::take(&mut self.inbuf);
        let key = &plan.key;
        match self.stage {
            Stage::AwaitHello => {
                let from = match check_hello(&msg, plan, connected) {
                    Ok(from) => from,
                    Err(why) => return Ok(Outcome::Refused(why)),
                };
                self.peer = Some(from);
                self.hello.copy_from_slice(&msg);
                self.server_nonce = rand::random();
                let mode = plan.protection.code().to_le_bytes();
                let proof = mac(key, &[SERVER_LABEL, &self.hello, &self.server_nonce, &mode]);
                self.out.extend_from_slice(&self.server_nonce);
                self.out.extend_from_slice(&proof);
                self.out.extend_from_slice(&mode);
                self.stage = Stage::AwaitProof;
                self.want = PROOF_LEN;
            }
            Stage::AwaitChallenge => {
                let (nonce, rest) = msg.split_at(32);
                let (proof, mode) = rest.split_at(32);
                let peer = self.peer.expect("a connector knows its peer");
                if !verify_mac(key, &[SERVER_LABEL, &self.hello, nonce, mode], proof) {
                    return Ok(Outcome::Fatal(format!(
                        "rank {peer} at {} did not prove it holds this job's key: the ranks hold \
                         different job keys (TORCHCOMMS_JOB_KEY / TORCHCOMMS_JOB_KEY_FILE, see \
                         docs/security.md), or another process answers at that address",
                        self.addr
                    )));
                }
                self.server_nonce.copy_from_slice(nonce);
                let theirs = u32::from_le_bytes(mode.try_into().expect("4 bytes"));
                if theirs != plan.protection.code() {
                    // Prove the key all the same, so the acceptor may fail too.
                    self.mismatch = Some(mode_mismatch(plan, peer, theirs));
                }
                let mine = mac(key, &[CLIENT_LABEL, &self.hello, &self.server_nonce]);
                self.out.extend_from_slice(&mine);
                self.stage = Stage::AwaitAck;
                self.want = 1;
            }
            Stage::AwaitProof => {
                let from = self.peer.expect("known after HELLO");
                if !verify_mac(key, &[CLIENT_LABEL, &self.hello, &self.server_nonce], &msg) {
                    return Ok(Outcome::Refused(format!(
                        "a connection claiming rank {from} failed the key proof (a process \
                         without this job's key, or a rank with another TORCHCOMMS_JOB_KEY)"
                    )));
                }
                let theirs = hello_word(&self.hello, HELLO_MODE);
                if theirs != plan.protection.code() {
                    return Ok(Outcome::Fatal(mode_mismatch(plan, from, theirs)));
                }
                if connected[from] {
                    return Ok(Outcome::Refused(format!(
                        "rank {from} is already connected"
                    )));
                }
                self.out.push(1);
                self.stage = Stage::SendingAck;
            }
            Stage::AwaitAck => {
                if let Some(why) = self.mismatch.take() {
                    return Ok(Outcome::Fatal(why));
                }
                let peer = self.peer.expect("a connector knows its peer");
                return Ok(if msg == [1] {
                    Outcome::Done(peer)
                } else {
                    Outcome::Retry(format!("rank {peer} answered {msg:?} instead of an ack"))
                });
            }
            Stage::Connecting | Stage::SendingAck => unreachable!("handled above"),
        }
        // Send what this step queued; the next event goes on from there.
        self.flush()?;
        if self.stage == Stage::SendingAck && self.out_pos == self.out.len() {
            return Ok(Outcome::Done(self.peer.expect("known after HELLO")));
        }
        Ok(Outcome::Pending)
    }

    /// Writes queued bytes until the socket would block.
    fn flush(&mut self) -> io::Result<()> {
        while self.out_pos < self.out.len() {
            match (&self.sock).write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The little-endian word at `at` of a HELLO.
fn hello_word(h: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"))
}

/// Why init fails when `peer` protects its data path with the mode of code `theirs`.
fn mode_mismatch(plan: &MeshPlan, peer: usize, theirs: u32) -> String {
    format!(
        "{} differs between ranks: rank {} uses {}, rank {peer} uses {}; every rank must set \
         the same value",
        Protection::CVAR,
        plan.rank,
        plan.protection,
        Protection::name_of_code(theirs)
    )
}

/// Checks a HELLO from an accepted connection; returns the peer's rank or why it was refused.
pub(crate) fn check_hello(h: &[u8], plan: &MeshPlan, connected: &[bool]) -> Result<usize, String> {
    if &h[..8] != HELLO_MAGIC {
        return Err("not a torchcomms-rs peer (bad magic)".into());
    }
    let word = |i: usize| hello_word(h, i);
    let version = word(8);
    if version != HELLO_VERSION {
        return Err(format!(
            "protocol version {version}, expected {HELLO_VERSION}"
        ));
    }
    let (from, to) = (word(12) as usize, word(16) as usize);
    if to != plan.rank {
        return Err(format!(
            "addressed to rank {to}, this is rank {}",
            plan.rank
        ));
    }
    if from >= plan.rank {
        return Err(format!(
            "rank {from} must not connect to lower rank {}",
            plan.rank
        ));
    }
    if connected[from] {
        return Err(format!("rank {from} is already connected"));
    }
    Ok(from)
}
