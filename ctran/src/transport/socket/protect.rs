//! Optional protection of the TCP data path (`TORCHCOMMS_DATA_PROTECTION`): after the
//! handshake, every frame a connection carries is authenticated (`integrity`) or encrypted and
//! authenticated (`encrypt`), so that someone who can rewrite the stream between two ranks
//! cannot change, replay or reorder what they exchange without the receiver noticing.
//!
//! Both ends of a connection derive two keys (HKDF-SHA-256), one per direction, from the
//! communicator's key (which derives from the job key) and the handshake's transcript: the
//! connector's HELLO, with its random nonce, and the acceptor's random nonce. So every
//! connection and direction has keys of its own, as TLS 1.3 with an external pre-shared key
//! would give; `docs/security.md` says why this is not TLS itself.
//!
//! A protected frame on the wire is a sequence of records, each followed by its 16-byte tag:
//!
//! ```text
//! header (32 B) | tag | chunk 0 (CHUNK B) | tag | chunk 1 | tag | ... | last chunk | tag
//! ```
//!
//! Each record's nonce is the next value of its direction's 64-bit counter (never reused, never
//! sent), so a record that is dropped, replayed or moved fails its check. The receiver reads a
//! header record whole before it acts on it, and reads each chunk straight into the receive
//! buffer, where it is checked (and decrypted) once its tag arrived: a receive completes only
//! after its last tag verified. `encrypt` uses AES-256-GCM, encrypting each chunk of a send
//! into a staging buffer of one chunk (the caller's buffer is never written). `integrity` sends
//! the caller's bytes as they are and authenticates each record as the associated data of
//! ChaCha20-Poly1305: ring computes Poly1305 over it in bulk, but AES-GCM's associated data
//! one 16-byte block per call, two to three times slower (`docs/security.md`). ring picks
//! AES-NI/VAES, PCLMUL and AVX2 code at run time; with VAES, encrypting costs less than the
//! integrity-only MAC (`docs/perf/security.md`).

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read};

use ring::aead::{self, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use ring::hkdf;
use socket2::Socket;

use super::frame::HEADER_LEN;
use crate::span::Span;

/// Bytes of a record's authentication tag.
pub(super) const TAG_LEN: usize = 16;
/// Most payload bytes of one record. A sender in `encrypt` stages one chunk, and a receiver
/// checks a chunk as soon as it is whole, so large messages stream with bounded memory; a
/// chunk stays in the L2 cache between the copy, the cipher and the socket.
pub(super) const CHUNK: usize = 256 << 10;
/// Bytes of a header record on the wire: the header and its tag.
pub(super) const SEALED_HEADER: usize = HEADER_LEN + TAG_LEN;

/// What protects the frames of TCP connections after their handshake. Every rank of a
/// communicator must use the same: the handshake compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protection {
    /// Plain TCP (the default): the handshake authenticated the peer, the data is not protected.
    #[default]
    None,
    /// Every frame authenticated; the payload travels readable and is never copied.
    Integrity,
    /// Every frame encrypted and authenticated.
    Encrypt,
}

impl Protection {
    /// The cvar that selects it.
    pub const CVAR: &'static str = "TORCHCOMMS_DATA_PROTECTION";

    /// Most payload bytes of one sealed record ([`CHUNK`]), for tests of sizes around it.
    pub const CHUNK_BYTES: usize = CHUNK;

    /// The mode named `name` (the cvar's values).
    pub fn parse(name: &str) -> Option<Protection> {
        [Protection::None, Protection::Integrity, Protection::Encrypt]
            .into_iter()
            .find(|p| p.name() == name)
    }

    /// Its name, as the cvar spells it.
    pub fn name(self) -> &'static str {
        match self {
            Protection::None => "none",
            Protection::Integrity => "integrity",
            Protection::Encrypt => "encrypt",
        }
    }

    /// Its code in the handshake.
    pub(crate) fn code(self) -> u32 {
        self as u32
    }

    /// The name of a peer's code, for messages (a code this build does not know included).
    pub(crate) fn name_of_code(code: u32) -> String {
        [Protection::None, Protection::Integrity, Protection::Encrypt]
            .into_iter()
            .find(|p| p.code() == code)
            .map_or_else(
                || format!("an unknown mode (code {code})"),
                |p| p.name().into(),
            )
    }
}

impl fmt::Display for Protection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes on the wire of a protected frame with `len` payload bytes.
pub(super) fn frame_len(len: usize) -> usize {
    SEALED_HEADER + sealed_payload_len(len)
}

/// Bytes on the wire of `len` payload bytes: the chunks and their tags.
fn sealed_payload_len(len: usize) -> usize {
    len + len.div_ceil(CHUNK) * TAG_LEN
}

/// Whether `off` bytes of the sealed payload of a `len`-byte message are all of it.
pub(super) fn payload_done(len: usize, off: usize) -> bool {
    off == sealed_payload_len(len)
}

/// The chunk that byte `off` of a sealed payload of `len` bytes falls in: its first payload
/// byte, its length, and where `off` is in the chunk and its tag.
fn chunk_at(len: usize, off: usize) -> (usize, usize, usize) {
    let k = off / (CHUNK + TAG_LEN);
    let start = k * CHUNK;
    (start, (len - start).min(CHUNK), off - k * (CHUNK + TAG_LEN))
}

/// A record failed its check: altered, replayed, reordered, or sealed under other keys.
#[derive(Debug)]
pub(super) struct Forged;

/// Why reading a protected frame stopped.
#[derive(Debug)]
pub(super) enum OpenError {
    /// The socket failed.
    Io(io::Error),
    /// The peer closed the connection.
    Closed,
    /// A record failed its check.
    Forged,
}

impl From<Forged> for OpenError {
    fn from(_: Forged) -> OpenError {
        OpenError::Forged
    }
}

/// One direction of a connection: its key and the counter its nonces come from.
#[derive(Debug)]
struct Direction {
    key: LessSafeKey,
    encrypt: bool,
    /// The next record's number.
    next: u64,
}

impl Direction {
    fn new(mode: Protection, prk: &hkdf::Prk, label: &[u8]) -> Direction {
        let alg = match mode {
            Protection::Encrypt => &aead::AES_256_GCM,
            _ => &aead::CHACHA20_POLY1305,
        };
        let info = [
            b"torchcomms-rs data key v1".as_slice(),
            label,
            mode.name().as_bytes(),
        ];
        let okm = prk
            .expand(&info, alg)
            .expect("HKDF-SHA-256 gives 32 bytes (up to 8160)");
        Direction {
            key: LessSafeKey::new(UnboundKey::from(okm)),
            encrypt: mode == Protection::Encrypt,
            next: 0,
        }
    }

    fn nonce(&self) -> Nonce {
        let mut n = [0u8; aead::NONCE_LEN];
        n[4..].copy_from_slice(&self.next.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    fn advance(&mut self) {
        // 2^64 records of at least 16 bytes each: never, but a wrapped counter would reuse
        // nonces, so it must stop rather than wrap.
        self.next = self
            .next
            .checked_add(1)
            .expect("2^64 records on one connection");
    }

    /// Seals the record `buf`: encrypts it in place (`encrypt`) or authenticates it.
    fn seal(&mut self, buf: &mut [u8]) -> Tag {
        if !self.encrypt {
            return self.authenticate(buf);
        }
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(), Aad::empty(), buf)
            .expect("a record is far below the AEAD's limit");
        self.advance();
        tag
    }

    /// Authenticates the record `data`, left as it is (`integrity`).
    fn authenticate(&mut self, data: &[u8]) -> Tag {
        debug_assert!(!self.encrypt);
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(), Aad::from(data), &mut [])
            .expect("a record is far below the AEAD's limit");
        self.advance();
        tag
    }

    /// Checks the next record, `buf`, against `tag` (and decrypts it in place), without taking
    /// its nonce.
    fn check(&self, buf: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), Forged> {
        let tag = Tag::from(*tag);
        let opened = if self.encrypt {
            self.key
                .open_in_place_separate_tag(self.nonce(), Aad::empty(), tag, buf, 0..)
                .map(|_| ())
        } else {
            self.key
                .open_in_place_separate_tag(self.nonce(), Aad::from(&*buf), tag, &mut [], 0..)
                .map(|_| ())
        };
        opened.map_err(|_| Forged)
    }

    /// Checks the next record and takes its nonce.
    fn open(&mut self, buf: &mut [u8], tag: &[u8; TAG_LEN]) -> Result<(), Forged> {
        self.check(buf, tag)?;
        self.advance();
        Ok(())
    }
}

/// The protection state of one connection: what it sends and what it receives.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) seal: Sealer,
    pub(super) open: Opener,
}

/// The session of a connection whose handshake sent `hello` (the connector's HELLO, which
/// carries its nonce, ranks and mode) and `server_nonce`, under the communicator's `key`;
/// `None` when `mode` is [`Protection::None`]. Both ends derive the same two keys and take the
/// ones of their own direction.
pub(super) fn session(
    mode: Protection,
    key: &[u8; 32],
    hello: &[u8],
    server_nonce: &[u8; 32],
    connector: bool,
) -> Option<Session> {
    if mode == Protection::None {
        return None;
    }
    let transcript = [hello, server_nonce.as_slice()].concat();
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &transcript).extract(key);
    let to_acceptor = Direction::new(mode, &prk, b"connector to acceptor");
    let to_connector = Direction::new(mode, &prk, b"acceptor to connector");
    let (out, inbound) = if connector {
        (to_acceptor, to_connector)
    } else {
        (to_connector, to_acceptor)
    };
    Some(Session {
        seal: Sealer {
            dir: out,
            ready: 0,
            chunk: None,
            head: [0; SEALED_HEADER],
            tag: [0; TAG_LEN],
            staging: Vec::new(),
        },
        open: Opener {
            dir: inbound,
            head: [0; SEALED_HEADER],
            have: 0,
            tag: [0; TAG_LEN],
        },
    })
}

/// The sending half: seals the frame in progress one record at a time, as the socket takes it.
pub(super) struct Sealer {
    dir: Direction,
    /// Wire bytes of the frame in progress that are sealed (0: no frame begun). Records are
    /// sealed in the order they go out, so nothing may go before a frame once it began.
    ready: usize,
    /// The chunk being sent: its first payload byte and length.
    chunk: Option<(usize, usize)>,
    /// The header record of the frame in progress.
    head: [u8; SEALED_HEADER],
    /// The tag of the chunk being sent.
    tag: [u8; TAG_LEN],
    /// The chunk being sent, encrypted (`encrypt` only; one chunk at most).
    staging: Vec<u8>,
}

impl fmt::Debug for Sealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sealer")
            .field("next", &self.dir.next)
            .field("ready", &self.ready)
            .field("chunk", &self.chunk)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A frame began (its header is sealed) and is not finished: the next frame must wait.
    pub(super) fn mid_frame(&self) -> bool {
        self.ready > 0
    }

    /// Writes more of the frame of `header` and payload `data`, of which `written` wire bytes
    /// went out already; returns how many more went out. Seals the header and each chunk just
    /// before its first byte goes out.
    pub(super) fn send_some(
        &mut self,
        sock: &Socket,
        header: &[u8; HEADER_LEN],
        data: Span,
        written: usize,
    ) -> io::Result<usize> {
        let total = frame_len(data.len());
        debug_assert!(written < total && written <= self.ready);
        if written == self.ready {
            self.prepare(header, data);
        }
        let head: &[u8] = self.head.get(written..).unwrap_or(&[]);
        // The chunk's bytes still to send (first payload byte, offset in the chunk, length),
        // and its tag's.
        let (start, skip, len, tag) = match self.chunk {
            Some((start, len)) => {
                let chunk_from = self.ready - len - TAG_LEN;
                let at = written.max(chunk_from) - chunk_from;
                (start, at.min(len), len, &self.tag[at.saturating_sub(len)..])
            }
            None => (0, 0, 0, &[][..]),
        };
        let send = |body: &[u8]| {
            let bufs = [IoSlice::new(head), IoSlice::new(body), IoSlice::new(tag)];
            sock.send_vectored_with_flags(&bufs, libc::MSG_NOSIGNAL)
        };
        let n = if self.dir.encrypt {
            send(&self.staging[skip..len])
        } else {
            // SAFETY: the span's owner keeps it valid and unmodified while the send is pending
            // (Transport::post_send contract); the slice lives only for this call.
            unsafe { data.sub(start + skip, len - skip).with_slice(send) }
        }?;
        if written + n == total {
            self.ready = 0;
            self.chunk = None;
        }
        Ok(n)
    }

    /// Seals what goes out next: the header (with the first chunk) at the start of a frame,
    /// else the next chunk.
    fn prepare(&mut self, header: &[u8; HEADER_LEN], data: Span) {
        let mut at = self.ready;
        if at == 0 {
            self.head[..HEADER_LEN].copy_from_slice(header);
            let tag = self.dir.seal(&mut self.head[..HEADER_LEN]);
            self.head[HEADER_LEN..].copy_from_slice(tag.as_ref());
            at = SEALED_HEADER;
        }
        self.chunk = None;
        if at < frame_len(data.len()) {
            let (start, len, within) = chunk_at(data.len(), at - SEALED_HEADER);
            debug_assert_eq!(within, 0, "chunks are sealed at their start");
            let chunk = data.sub(start, len);
            // SAFETY: as in `send_some`: the span is valid and unmodified while its send is
            // pending; the slice lives only for this call.
            let tag = unsafe {
                chunk.with_slice(|p| {
                    if self.dir.encrypt {
                        self.staging.clear();
                        self.staging.extend_from_slice(p);
                        self.dir.seal(&mut self.staging)
                    } else {
                        self.dir.authenticate(p)
                    }
                })
            };
            self.tag.copy_from_slice(tag.as_ref());
            self.chunk = Some((start, len));
            at += len + TAG_LEN;
        }
        self.ready = at;
    }

    /// A whole control frame (abort notice, goodbye) with a payload of at most one chunk,
    /// sealed into one buffer to be written at once. Only between frames.
    pub(super) fn seal_frame(&mut self, header: &[u8; HEADER_LEN], payload: &[u8]) -> Vec<u8> {
        debug_assert!(!self.mid_frame() && payload.len() <= CHUNK);
        let mut out = Vec::with_capacity(frame_len(payload.len()));
        out.extend_from_slice(header);
        let tag = self.dir.seal(&mut out[..HEADER_LEN]);
        out.extend_from_slice(tag.as_ref());
        if !payload.is_empty() {
            out.extend_from_slice(payload);
            let tag = self.dir.seal(&mut out[SEALED_HEADER..]);
            out.extend_from_slice(tag.as_ref());
        }
        out
    }
}

/// The receiving half: reads records and checks each before anything acts on it.
pub(super) struct Opener {
    dir: Direction,
    /// The header record being read.
    head: [u8; SEALED_HEADER],
    /// Bytes of it read so far.
    have: usize,
    /// The tag of the chunk being read.
    tag: [u8; TAG_LEN],
}

impl fmt::Debug for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opener")
            .field("next", &self.dir.next)
            .field("have", &self.have)
            .finish_non_exhaustive()
    }
}

impl Opener {
    /// Reads the next header record; returns its header once it is whole and checked, `None`
    /// while the socket has no more of it.
    pub(super) fn read_header(
        &mut self,
        sock: &Socket,
    ) -> Result<Option<[u8; HEADER_LEN]>, OpenError> {
        while self.have < SEALED_HEADER {
            match (&*sock).read(&mut self.head[self.have..]) {
                Ok(0) => return Err(OpenError::Closed),
                Ok(n) => self.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(OpenError::Io(e)),
            }
        }
        self.have = 0;
        let record = self.head;
        Ok(Some(self.open_header(&record)?))
    }

    /// Checks a whole header record and takes its nonce; returns the header.
    pub(super) fn open_header(
        &mut self,
        record: &[u8; SEALED_HEADER],
    ) -> Result<[u8; HEADER_LEN], Forged> {
        let header = self.peek_header(record)?;
        self.dir.advance();
        Ok(header)
    }

    /// Checks a header record that stays in the socket (peeked), without taking its nonce: it
    /// is opened again when read.
    pub(super) fn peek_header(
        &self,
        record: &[u8; SEALED_HEADER],
    ) -> Result<[u8; HEADER_LEN], Forged> {
        let (header, tag) = record.split_at(HEADER_LEN);
        let mut header: [u8; HEADER_LEN] = header.try_into().expect("32 bytes");
        self.dir
            .check(&mut header, tag.try_into().expect("16 bytes"))?;
        Ok(header)
    }

    /// Reads the sealed payload of a message of `data.len()` bytes into `data`, of which `off`
    /// bytes were read before; checks (and decrypts) each chunk in place once its tag arrived.
    /// Returns when the payload is complete or the socket has no more.
    pub(super) fn read_payload(
        &mut self,
        sock: &Socket,
        data: Span,
        off: &mut usize,
    ) -> Result<(), OpenError> {
        let len = data.len();
        while !payload_done(len, *off) {
            let (start, clen, within) = chunk_at(len, *off);
            let read = if within < clen {
                let body = data.sub(start + within, clen - within);
                let tag = &mut self.tag;
                // SAFETY: the receive buffer is reserved for this request until it finishes
                // (Transport::post_recv contract); the slice lives only for this call. The read
                // never goes past this chunk's tag.
                unsafe {
                    body.with_mut_slice(|p| {
                        let mut bufs = [IoSliceMut::new(p), IoSliceMut::new(tag)];
                        (&*sock).read_vectored(&mut bufs)
                    })
                }
            } else {
                (&*sock).read(&mut self.tag[within - clen..])
            };
            let n = match read {
                Ok(0) => return Err(OpenError::Closed),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(OpenError::Io(e)),
            };
            *off += n;
            if within + n == clen + TAG_LEN {
                let tag = self.tag;
                // SAFETY: as above; the chunk is whole and nothing reads it meanwhile.
                unsafe {
                    data.sub(start, clen)
                        .with_mut_slice(|p| self.dir.open(p, &tag))
                }?;
            }
        }
        Ok(())
    }

    /// Reads and checks the `len`-byte reason of an abort notice whose header was just read.
    /// Best effort, as the notice is the peer's last frame: never waits for bytes not there.
    pub(super) fn read_reason(&mut self, sock: &Socket, len: usize) -> Result<Vec<u8>, OpenError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let mut record = vec![0u8; len + TAG_LEN];
        let mut have = 0;
        while have < record.len() {
            match (&*sock).read(&mut record[have..]) {
                Ok(0) => return Err(OpenError::Closed),
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(OpenError::Io(e)),
            }
        }
        let tag: [u8; TAG_LEN] = record[len..].try_into().expect("16 bytes");
        record.truncate(len);
        self.dir.open(&mut record, &tag)?;
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use socket2::{Domain, Type};

    use super::*;

    const HEADER: [u8; HEADER_LEN] = [0x5a; HEADER_LEN];

    /// The two ends of one connection's sessions, connector first.
    fn sessions(mode: Protection, acceptor_nonce: u8) -> (Session, Session) {
        let hello = [1u8; 64];
        let nonce = [acceptor_nonce; 32];
        let connector = session(mode, &[9; 32], &hello, &nonce, true).unwrap();
        let acceptor = session(mode, &[9; 32], &hello, &nonce, false).unwrap();
        (connector, acceptor)
    }

    /// The bytes `seal` puts on the wire for frames of `payloads`, in order.
    fn wire(seal: &mut Sealer, payloads: &[Vec<u8>]) -> Vec<u8> {
        let (a, b) = Socket::pair(Domain::UNIX, Type::STREAM, None).unwrap();
        let reader = thread::spawn(move || {
            let mut out = Vec::new();
            (&b).read_to_end(&mut out).unwrap();
            out
        });
        for p in payloads {
            let mut p = p.clone();
            let before = p.clone();
            // SAFETY: `p` outlives the span and is only read through it.
            let data = unsafe { Span::from_slice(&mut p) };
            let mut written = 0;
            while written < frame_len(p.len()) {
                written += seal.send_some(&a, &HEADER, data, written).unwrap();
            }
            assert!(!seal.mid_frame());
            assert_eq!(p, before, "the send buffer is never written");
        }
        drop(a);
        reader.join().unwrap()
    }

    /// Reads frames of `lens` bytes from `bytes` through `open`: each payload, or the error.
    fn read_back(
        open: &mut Opener,
        bytes: &[u8],
        lens: &[usize],
    ) -> Result<Vec<Vec<u8>>, OpenError> {
        let (a, b) = Socket::pair(Domain::UNIX, Type::STREAM, None).unwrap();
        let bytes = bytes.to_vec();
        let writer = thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut &a, &bytes);
        });
        let mut out = Vec::new();
        for &len in lens {
            let header = open.read_header(&b)?.expect("a blocking socket");
            assert_eq!(header, HEADER);
            let mut buf = vec![0u8; len];
            // SAFETY: `buf` outlives the span and is only written through it.
            let data = unsafe { Span::from_slice(&mut buf) };
            let mut off = 0;
            open.read_payload(&b, data, &mut off)?;
            assert!(payload_done(len, off));
            out.push(buf);
        }
        writer.join().unwrap();
        Ok(out)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn the_layout_has_a_tag_per_record() {
        assert_eq!(frame_len(0), 48);
        assert_eq!(frame_len(1), 48 + 1 + 16);
        assert_eq!(frame_len(CHUNK), 48 + CHUNK + 16);
        assert_eq!(frame_len(CHUNK + 1), 48 + CHUNK + 1 + 32);
        assert_eq!(chunk_at(3 * CHUNK, CHUNK + TAG_LEN + 5), (CHUNK, CHUNK, 5));
        assert_eq!(chunk_at(CHUNK + 7, CHUNK + TAG_LEN), (CHUNK, 7, 0));
    }

    #[test]
    fn frames_of_every_size_round_trip_in_both_modes() {
        let lens = [0, 1, 7, 4093, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5];
        for mode in [Protection::Integrity, Protection::Encrypt] {
            let (mut c, mut a) = sessions(mode, 2);
            let payloads: Vec<Vec<u8>> = lens.iter().map(|&l| pattern(l, l as u8)).collect();
            let bytes = wire(&mut c.seal, &payloads);
            assert_eq!(
                bytes.len(),
                lens.iter().map(|&l| frame_len(l)).sum::<usize>()
            );
            // Readable on the wire in integrity, not in encrypt.
            let readable = bytes.windows(64).any(|w| w == &payloads[4][1000..1064]);
            assert_eq!(readable, mode == Protection::Integrity, "{mode}");
            let got =
                read_back(&mut a.open, &bytes, &lens).unwrap_or_else(|e| panic!("{mode}: {e:?}"));
            assert_eq!(got, payloads, "{mode}");
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_in_a_frame_fails_its_check() {
        let lens = [5, CHUNK + 3];
        for mode in [Protection::Integrity, Protection::Encrypt] {
            let (mut c, _) = sessions(mode, 3);
            let payloads: Vec<Vec<u8>> = lens.iter().map(|&l| pattern(l, 1)).collect();
            let bytes = wire(&mut c.seal, &payloads);
            // Header, its tag, payload, the first chunk's tag, the second chunk, the last tag.
            let first = frame_len(5);
            for at in [
                0,
                40,
                50,
                65,
                first + 47,
                first + 48 + 10,
                first + 48 + CHUNK + 3,
                bytes.len() - 1,
            ] {
                let mut bad = bytes.clone();
                bad[at] ^= 0x10;
                let (_, mut a) = sessions(mode, 3);
                let r = read_back(&mut a.open, &bad, &lens);
                assert!(
                    matches!(r, Err(OpenError::Forged)),
                    "{mode}, byte {at}: {r:?}"
                );
            }
        }
    }

    #[test]
    fn replayed_reordered_or_reflected_frames_fail() {
        let mode = Protection::Encrypt;
        let (mut c, _) = sessions(mode, 4);
        let one = wire(&mut c.seal, &[pattern(10, 1)]);
        let two = wire(&mut c.seal, &[pattern(10, 2)]);
        let check = |bytes: Vec<u8>, open: &mut Opener| read_back(open, &bytes, &[10, 10]);
        let (_, mut a) = sessions(mode, 4);
        assert!(check([one.clone(), two.clone()].concat(), &mut a.open).is_ok());
        let (_, mut a) = sessions(mode, 4);
        assert!(matches!(
            check([two.clone(), one.clone()].concat(), &mut a.open),
            Err(OpenError::Forged)
        ));
        let (_, mut a) = sessions(mode, 4);
        assert!(matches!(
            check([one.clone(), one.clone()].concat(), &mut a.open),
            Err(OpenError::Forged)
        ));
        // The connector's own records sent back to it (the other direction has its own key).
        let (mut c2, _) = sessions(mode, 4);
        assert!(matches!(
            check([one.clone(), two.clone()].concat(), &mut c2.open),
            Err(OpenError::Forged)
        ));
        // Another connection (another acceptor nonce) has other keys.
        let (_, mut other) = sessions(mode, 5);
        assert!(matches!(
            check([one, two].concat(), &mut other.open),
            Err(OpenError::Forged)
        ));
    }

    #[test]
    fn control_frames_carry_their_payload_sealed() {
        for mode in [Protection::Integrity, Protection::Encrypt] {
            let (mut c, mut a) = sessions(mode, 6);
            let bye = c.seal.seal_frame(&HEADER, &[]);
            let abort = c.seal.seal_frame(&HEADER, b"rank 0 failed");
            assert_eq!((bye.len(), abort.len()), (frame_len(0), frame_len(13)));
            let (s, r) = Socket::pair(Domain::UNIX, Type::STREAM, None).unwrap();
            std::io::Write::write_all(&mut &s, &[bye, abort].concat()).unwrap();
            assert_eq!(a.open.read_header(&r).unwrap(), Some(HEADER));
            assert_eq!(a.open.read_header(&r).unwrap(), Some(HEADER));
            assert_eq!(a.open.read_reason(&r, 13).unwrap(), b"rank 0 failed");
        }
    }

    #[test]
    fn modes_parse_and_name_their_codes() {
        for p in [Protection::None, Protection::Integrity, Protection::Encrypt] {
            assert_eq!(Protection::parse(p.name()), Some(p));
            assert_eq!(Protection::name_of_code(p.code()), p.name());
        }
        assert_eq!(Protection::parse("tls"), None);
        assert!(Protection::name_of_code(7).contains("unknown"));
    }
}
