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

/// A frame of the RDMA transfer API's connection as the peer sends it (length-prefixed: a
/// write or read request, or a response). A frame that decodes encodes back to exactly the
/// bytes it was read from; the decoder never panics nor allocates past its bound.
pub fn rdma_frame(data: &[u8]) {
    let mut rest = data;
    if let Ok(f) = crate::rdma::wire::Frame::recv(&mut rest) {
        let used = data.len() - rest.len();
        assert_eq!(f.encode(), &data[..used], "{f:?} does not round-trip");
    }
}

/// The text a peer hands over for the RDMA transfer API: first byte even for an access key,
/// odd for a peer URL. What parses prints back to text that parses to the same value.
pub fn rdma_text(data: &[u8]) {
    let Some((&which, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    if which % 2 == 0 {
        if let Ok(k) = crate::rdma::AccessKey::parse(&text) {
            assert_eq!(crate::rdma::AccessKey::parse(&k.encode()).ok(), Some(k));
        }
    } else if let Ok(u) = crate::rdma::PeerUrl::parse(&text) {
        assert_eq!(crate::rdma::PeerUrl::parse(&u.to_string()).ok(), Some(u));
    }
}

/// A control slot of the ib transport as a peer RDMA-writes it (64 bytes), then the message
/// number the reader expects (`u64`). A slot that decodes re-encodes to a slot that decodes
/// to the same message.
pub fn ib_control(data: &[u8]) {
    use crate::transport::ib::wire::{Ctl, SLOT};
    let Some((slot, rest)) = data.split_first_chunk::<SLOT>() else {
        return;
    };
    let n = rest
        .first_chunk::<8>()
        .map_or(0, |b| u64::from_le_bytes(*b));
    if let Ok((ctl, acked)) = Ctl::decode(slot, n) {
        let again = Ctl::decode(&ctl.encode(n, acked), n);
        match (&ctl, &again) {
            // A reason is text for people: read leniently (lossy UTF-8), cut again on writing.
            (Ctl::Abort { .. }, Ok((Ctl::Abort { .. }, a))) => assert_eq!(*a, acked),
            _ => assert_eq!(again, Ok((ctl, acked)), "does not round-trip"),
        }
    }
}

/// Seeds of the RDMA and ib targets, `(target, name, bytes)`: messages as this build's
/// encoders write them.
pub fn rdma_and_ib_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::rdma::wire::{Frame, Status, Via};
    use crate::transport::ib::wire::Ctl;
    use crate::transport::OpTag;
    let mut out = Vec::new();
    let key = crate::rdma::AccessKey {
        host: 0x1234,
        pid: 42,
        nonce: 7,
        id: 3,
        generation: 9,
        addr: 0x7f00_0000_0000,
        len: 4096,
        device: crate::rdma::MemDevice::Cuda(1),
    };
    let frames = [
        (
            "write-ib-in-place",
            Frame::Write {
                req: 1,
                key: key.encode(),
                dst: 0x7f00_0000_0100,
                len: 256,
                notify: true,
                via: Via::IbDirect {
                    key: ibverbx::RemoteKey {
                        addr: 0x5500_0000,
                        len: 256,
                        rkey: 0x1001,
                    },
                },
            },
        ),
        (
            "read-cma",
            Frame::Read {
                req: 2,
                key: key.encode(),
                src: 0x7f00_0000_0000,
                len: 4096,
                via: Via::Cma {
                    pid: 77,
                    addr: 0x1000,
                },
            },
        ),
        (
            "response",
            Frame::Response {
                req: 2,
                status: Status::NoDirect,
                text: "no dma-buf".into(),
                payload: 0,
            },
        ),
    ];
    for (name, f) in frames {
        out.push(("rdma_frame", name.to_string(), f.encode()));
    }
    out.push((
        "rdma_text",
        "key".to_string(),
        [&[0u8][..], key.encode().as_bytes()].concat(),
    ));
    let url = format!(
        "tcrdma1://10.0.0.2:4000/{}/{:016x}/42/ib=54435249",
        "ab".repeat(16),
        0x1234
    );
    out.push((
        "rdma_text",
        "url".to_string(),
        [&[1u8][..], url.as_bytes()].concat(),
    ));
    let tag = OpTag { word: 5, seq: 6 };
    let ctls = [
        (
            "cts",
            Ctl::Cts {
                rid: 1,
                tag,
                len: 4096,
                addr: 0x10_0000_0000,
                rkey: 0x1002,
            },
        ),
        (
            "put",
            Ctl::Put {
                region: 3,
                offset: 64,
                len: 128,
            },
        ),
        (
            "abort",
            Ctl::Abort {
                reason: "peer failed".into(),
            },
        ),
    ];
    for (i, (name, c)) in ctls.into_iter().enumerate() {
        let mut b = c.encode(i as u64, 2).to_vec();
        b.extend((i as u64).to_le_bytes());
        out.push(("ib_control", name.to_string(), b));
    }
    out
}
