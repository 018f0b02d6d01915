//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not an API).
//!
//! Each takes the fuzzer's bytes and drives one decoder of data that another process wrote:
//! the TCP frame header, the mesh hello, the shared-memory slot headers and FIFO indices, and
//! the records ranks publish at creation. They go through the narrowest decode function of
//! each, so a change of a wire format changes only how the bytes are split here.

use std::net::SocketAddr;

use crate::span::Span;
use crate::transport::shm::slot::{fifo_used, Slot};
use crate::transport::socket::frame::{self, Frame, HEADER_LEN};
use crate::transport::socket::handshake::{check_hello, HELLO_LEN};
use crate::transport::socket::MeshPlan;

/// The peer rank named in errors.
const PEER: usize = 3;

/// A frame header as a peer may send it. A header that decodes must describe itself exactly
/// (data, probe and acknowledgement frames carry every field through a round trip); the
/// decoder never panics.
pub fn socket_frame(data: &[u8]) {
    let Some((header, _)) = data.split_first_chunk::<HEADER_LEN>() else {
        return;
    };
    if let Ok(f @ (Frame::Data { .. } | Frame::Probe { .. } | Frame::Ack { .. })) =
        frame::decode(header)
    {
        assert_eq!(&frame::encode(f), header, "{f:?} does not round-trip");
    }
}

/// A hello, then this rank and the communicator size (`u8` each), then a bitmap of the ranks
/// already connected.
pub fn socket_hello(data: &[u8]) {
    let Some((hello, rest)) = data.split_first_chunk::<HELLO_LEN>() else {
        return;
    };
    let Some((&[rank, size], rest)) = rest.split_first_chunk::<2>() else {
        return;
    };
    let size = usize::from(size).max(1);
    let rank = usize::from(rank) % size;
    let connected: Vec<bool> = (0..size)
        .map(|r| rest.get(r / 8).is_some_and(|b| b >> (r % 8) & 1 != 0))
        .collect();
    let plan = MeshPlan {
        comm: "fuzz".into(),
        rank,
        addrs: vec![SocketAddr::from(([127, 0, 0, 1], 1)); size],
        key: [0x5a; 32],
        handshake_timeout: std::time::Duration::from_secs(1),
        protection: Default::default(),
        local_pids: Vec::new(),
    };
    if let Ok(from) = check_hello(hello, &plan, &connected) {
        assert!(from < rank && !connected[from], "accepted rank {from}");
    }
}

/// A receive of `u16` bytes through slots of `u8 + 1` bytes in a FIFO of `u8 % 8 + 1` slots,
/// then slots as the peer left them: 24 bytes each, the FIFO head, the slot's message length
/// and its chunk length (`u64` each). Does what the shared-memory transport does with each
/// slot, including the copy, so an accepted header that does not fit panics here.
pub fn shm_slot(data: &[u8]) {
    let Some((&[a, b, slot_bytes, k], rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let expected = usize::from(u16::from_le_bytes([a, b])) % 8192;
    let slot_bytes = usize::from(slot_bytes) + 1;
    let k = u64::from(k % 8) + 1;
    let mut dst = vec![0u8; expected];
    let mut payload = vec![0xa5u8; slot_bytes];
    // SAFETY: both vectors live until the end of this function and are used only through
    // these spans.
    let (dst_span, src_span) =
        unsafe { (Span::from_slice(&mut dst), Span::from_slice(&mut payload)) };
    let (mut tail, mut got, mut started) = (0u64, 0usize, false);
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().expect("8 bytes"));
    for rec in rest.chunks_exact(24) {
        let head = word(&rec[..8]);
        let slot = Slot {
            msg_len: word(&rec[8..16]),
            chunk_len: word(&rec[16..]),
        };
        match fifo_used(head, tail, k, PEER) {
            Ok(0) => continue,
            Ok(used) => assert!(used <= k),
            Err(_) => return,
        }
        let Ok(n) = slot.check(started, expected, got, slot_bytes, PEER) else {
            return;
        };
        dst_span.sub(got, n).copy_from(&src_span.sub(0, n));
        got += n;
        started = true;
        tail = tail.wrapping_add(1);
        if got == expected {
            // The next message begins.
            (got, started) = (0, false);
        }
    }
}

/// A selector byte, then a record as a rank publishes it at creation (see `comm::init`).
pub fn init_records(data: &[u8]) {
    crate::comm::fuzz_records(data);
}
