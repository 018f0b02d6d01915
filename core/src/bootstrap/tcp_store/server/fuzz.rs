//! Fuzzing entry of the server's decoder and request handling (feature `fuzzing`).
//!
//! Lives under `server` because the key-value state ([`Db`]) is private to it; the fuzz crate
//! reaches it through `tcp_store::fuzz`.

use super::super::decode::Decoder;
use super::super::protocol::Request;
use super::db::{ConnId, Db, Outbox};

/// Decodes `data` as the bytes clients sent, arriving `first byte % 16 + 1` bytes at a time
/// (the decoder resumes where it stopped), and runs every decoded request against one store, as
/// the server thread does. Requests go to three connections in turn, so waits, barriers and
/// queue pops of one are released by the others. Also checks that every decoded request
/// encodes back to the bytes it came from.
pub fn requests(data: &[u8]) {
    let Some((&step, data)) = data.split_first() else {
        return;
    };
    let step = usize::from(step % 16) + 1;
    let mut db = Db::default();
    let mut decoder = Decoder::new(1 << 20);
    let (mut pos, mut start, mut arrived) = (0, 0, step.min(data.len()));
    let mut n: ConnId = 0;
    loop {
        let Ok((used, req)) = decoder.feed(&data[pos..arrived]) else {
            // Garbage: the server closes the connection.
            return;
        };
        pos += used;
        if let Some(req) = req {
            assert_eq!(
                req.encode(),
                data[start..pos],
                "decoded request does not re-encode to its bytes"
            );
            start = pos;
            let conn = n % 3;
            n += 1;
            let mut out = Outbox::new();
            if db.handle(conn, req, usize::MAX, &mut out).is_err() {
                // The server drops the connection and forgets its waits.
                db.forget(conn);
            }
        } else if used == 0 {
            if arrived == data.len() {
                // Incomplete: the server waits for more bytes.
                return;
            }
            arrived = (arrived + step).min(data.len());
        }
    }
}

/// A session as a client sends it: one request of every kind, encoded by the encoder the
/// client uses (the seed of the server's corpus).
pub fn sample_session() -> Vec<u8> {
    let k = |s: &str| s.as_bytes().to_vec();
    let reqs = [
        Request::Validate {
            magic: super::super::protocol::VALIDATION_MAGIC,
        },
        Request::Ping { nonce: 7 },
        Request::Set {
            key: k("/a"),
            value: k("1"),
        },
        Request::Add {
            key: k("/a"),
            delta: 2,
        },
        Request::Wait {
            keys: vec![k("/b"), k("/a")],
        },
        Request::CompareSet {
            key: k("/b"),
            expected: vec![],
            desired: k("x"),
        },
        Request::Check {
            keys: vec![k("/a")],
        },
        Request::Get { key: k("/a") },
        Request::GetNumKeys,
        Request::Append {
            key: k("/a"),
            value: k("0"),
        },
        Request::MultiGet {
            keys: vec![k("/a"), k("/b")],
        },
        Request::MultiSet {
            pairs: vec![(k("/m"), k("v"))],
        },
        Request::QueuePush {
            key: k("/q"),
            value: k("item"),
        },
        Request::QueueLen { key: k("/q") },
        Request::QueuePop { key: k("/q") },
        Request::ListKeys,
        Request::DeleteKey { key: k("/m") },
        Request::Barrier {
            key: k("/bar"),
            world_size: 2,
        },
        Request::CancelWait,
    ];
    reqs.iter().flat_map(Request::encode).collect()
}
