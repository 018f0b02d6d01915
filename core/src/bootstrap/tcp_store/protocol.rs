//! The wire format of `torch.distributed.TCPStore`, shared by our client and server.
//!
//! Everything is little-endian host order as torch writes it (`sendValue` copies the raw bytes
//! of the value; every machine torch supports is little-endian, so we fix LE explicitly).
//!
//! A request is one command byte ([`Query`]) followed by its arguments:
//! strings and byte vectors are a `u64` length then the bytes; counts are `u64`; integers are
//! `i64`; the validation magic and the ping nonce are `u32`. Responses carry no command byte:
//! the client knows what it asked for.
//!
//! | command        | arguments                               | response                          |
//! |----------------|-----------------------------------------|-----------------------------------|
//! | `VALIDATE` 0   | `u32` magic                             | none                              |
//! | `SET` 1        | key, value                              | none                              |
//! | `COMPARE_SET` 2| key, expected, desired                  | bytes now stored                  |
//! | `GET` 3        | key                                     | bytes                             |
//! | `ADD` 4        | key, `i64` delta                        | `i64` new value                   |
//! | `CHECK` 5      | `u64` n, n keys                         | `u8` 0 ready / 1 not ready        |
//! | `WAIT` 6       | `u64` n, n keys                         | `u8` 0 (STOP_WAITING), possibly much later |
//! | `GETNUMKEYS` 7 | -                                       | `i64`                             |
//! | `DELETE_KEY` 8 | key                                     | `i64` number deleted (0 or 1)     |
//! | `APPEND` 9     | key, value                              | none                              |
//! | `MULTI_GET` 10 | `u64` n, n keys                         | n byte vectors                    |
//! | `MULTI_SET` 11 | `u64` n, n (key, value)                 | none                              |
//! | `CANCEL_WAIT` 12 | -                                     | `u8` 1 (WAIT_CANCELED)            |
//! | `PING` 13      | `u32` nonce                             | `u32` same nonce                  |
//! | `QUEUE_PUSH` 14| key, value                              | none                              |
//! | `QUEUE_POP` 15 | key                                     | `i64` length before pop, then the value if it was > 0 |
//! | `QUEUE_LEN` 16 | key                                     | `i64`                             |
//! | `LIST_KEYS` 17 | -                                       | `i64` n, n strings                |
//! | `BARRIER` 18   | key, `i64` world size                   | `u8` 0 once world size arrived    |

use std::fmt;

/// Sent as the first request of every connection; servers drop connections that do not start
/// with it (it keeps port scanners and stray HTTP clients from corrupting the store).
pub(crate) const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// `CheckResponseType::READY`.
pub(crate) const CHECK_READY: u8 = 0;
/// `CheckResponseType::NOT_READY`.
pub(crate) const CHECK_NOT_READY: u8 = 1;
/// `WaitResponseType::STOP_WAITING`: the awaited keys exist (or the barrier is complete).
pub(crate) const WAIT_STOP_WAITING: u8 = 0;
/// `WaitResponseType::WAIT_CANCELED`: answer to `CANCEL_WAIT`.
pub(crate) const WAIT_CANCELED: u8 = 1;

/// Longest key our server accepts (torch's libuv server allows 8 KiB; the legacy one any).
pub(crate) const MAX_KEY_LEN: u64 = 64 * 1024;
/// Largest value any server of ours accepts, whatever `TORCHCOMMS_STORE_MAX_VALUE_BYTES` says
/// (torch's libuv server allows 8 MiB).
pub(crate) const MAX_VALUE_LEN: u64 = 512 * 1024 * 1024;
/// Most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET (torch's libuv server allows 128 Ki).
pub(crate) const MAX_KEY_COUNT: u64 = 1024 * 1024;

/// The command byte, `c10d::detail::QueryType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Query {
    Validate = 0,
    Set = 1,
    CompareSet = 2,
    Get = 3,
    Add = 4,
    Check = 5,
    Wait = 6,
    GetNumKeys = 7,
    DeleteKey = 8,
    Append = 9,
    MultiGet = 10,
    MultiSet = 11,
    CancelWait = 12,
    Ping = 13,
    QueuePush = 14,
    QueuePop = 15,
    QueueLen = 16,
    ListKeys = 17,
    Barrier = 18,
}

impl Query {
    pub(crate) fn from_u8(b: u8) -> Option<Query> {
        use Query::*;
        Some(match b {
            0 => Validate,
            1 => Set,
            2 => CompareSet,
            3 => Get,
            4 => Add,
            5 => Check,
            6 => Wait,
            7 => GetNumKeys,
            8 => DeleteKey,
            9 => Append,
            10 => MultiGet,
            11 => MultiSet,
            12 => CancelWait,
            13 => Ping,
            14 => QueuePush,
            15 => QueuePop,
            16 => QueueLen,
            17 => ListKeys,
            18 => Barrier,
            _ => return None,
        })
    }
}

/// One decoded request. Keys are raw bytes: torch keys are `std::string`, not necessarily UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    Validate {
        magic: u32,
    },
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    Get {
        key: Vec<u8>,
    },
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    Check {
        keys: Vec<Vec<u8>>,
    },
    Wait {
        keys: Vec<Vec<u8>>,
    },
    GetNumKeys,
    DeleteKey {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiGet {
        keys: Vec<Vec<u8>>,
    },
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    CancelWait,
    Ping {
        nonce: u32,
    },
    QueuePush {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    QueuePop {
        key: Vec<u8>,
    },
    QueueLen {
        key: Vec<u8>,
    },
    ListKeys,
    Barrier {
        key: Vec<u8>,
        world_size: i64,
    },
}

/// A request that cannot be decoded; the server closes the connection (as torch does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtocolError(pub(crate) String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Request {
    /// Decodes the first request in `buf` (with the largest value limit). `Ok(None)` means more
    /// bytes are needed; otherwise the request and the number of bytes it used. The server
    /// decodes incrementally instead ([`Decoder`](super::decode::Decoder)).
    #[cfg(test)]
    pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Request, usize)>, ProtocolError> {
        let mut d = super::decode::Decoder::new(MAX_VALUE_LEN);
        let (used, req) = d.feed(buf)?;
        Ok(req.map(|r| (r, used)))
    }

    /// Encodes the request as one buffer, so the client sends it with one write (torch's client
    /// batches the same way; a request split over many tiny writes costs a round trip each with
    /// Nagle's algorithm).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        match self {
            Request::Validate { magic } => e.cmd(Query::Validate).u32(*magic),
            Request::Set { key, value } => e.cmd(Query::Set).bytes(key).bytes(value),
            Request::CompareSet {
                key,
                expected,
                desired,
            } => e
                .cmd(Query::CompareSet)
                .bytes(key)
                .bytes(expected)
                .bytes(desired),
            Request::Get { key } => e.cmd(Query::Get).bytes(key),
            Request::Add { key, delta } => e.cmd(Query::Add).bytes(key).i64(*delta),
            Request::Check { keys } => e.cmd(Query::Check).keys(keys),
            Request::Wait { keys } => e.cmd(Query::Wait).keys(keys),
            Request::GetNumKeys => e.cmd(Query::GetNumKeys),
            Request::DeleteKey { key } => e.cmd(Query::DeleteKey).bytes(key),
            Request::Append { key, value } => e.cmd(Query::Append).bytes(key).bytes(value),
            Request::MultiGet { keys } => e.cmd(Query::MultiGet).keys(keys),
            Request::MultiSet { pairs } => {
                let e = e.cmd(Query::MultiSet).u64(pairs.len() as u64);
                for (k, v) in pairs {
                    e.bytes(k).bytes(v);
                }
                e
            }
            Request::CancelWait => e.cmd(Query::CancelWait),
            Request::Ping { nonce } => e.cmd(Query::Ping).u32(*nonce),
            Request::QueuePush { key, value } => e.cmd(Query::QueuePush).bytes(key).bytes(value),
            Request::QueuePop { key } => e.cmd(Query::QueuePop).bytes(key),
            Request::QueueLen { key } => e.cmd(Query::QueueLen).bytes(key),
            Request::ListKeys => e.cmd(Query::ListKeys),
            Request::Barrier { key, world_size } => {
                e.cmd(Query::Barrier).bytes(key).i64(*world_size)
            }
        };
        e.0
    }
}

/// Builds requests and responses in the torch encoding.
#[derive(Debug, Default)]
pub(crate) struct Encoder(pub(crate) Vec<u8>);

impl Encoder {
    fn cmd(&mut self, q: Query) -> &mut Self {
        self.0.push(q as u8);
        self
    }

    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A length-prefixed string or byte vector (`sendString` / `sendVector<uint8_t>`).
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }

    fn keys(&mut self, keys: &[Vec<u8>]) -> &mut Self {
        self.u64(keys.len() as u64);
        for k in keys {
            self.bytes(k);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_requests() -> Vec<Request> {
        let k = |s: &str| s.as_bytes().to_vec();
        vec![
            Request::Validate {
                magic: VALIDATION_MAGIC,
            },
            Request::Set {
                key: k("/a"),
                value: vec![0, 1, 2],
            },
            Request::CompareSet {
                key: k("/a"),
                expected: vec![],
                desired: k("x"),
            },
            Request::Get { key: k("/a") },
            Request::Add {
                key: k("/c"),
                delta: -7,
            },
            Request::Check {
                keys: vec![k("/a"), k("/b")],
            },
            Request::Wait { keys: vec![] },
            Request::GetNumKeys,
            Request::DeleteKey { key: k("/a") },
            Request::Append {
                key: k("/a"),
                value: k("yz"),
            },
            Request::MultiGet {
                keys: vec![k("/a")],
            },
            Request::MultiSet {
                pairs: vec![(k("/m1"), k("1")), (k("/m2"), vec![])],
            },
            Request::CancelWait,
            Request::Ping { nonce: 0xdead_beef },
            Request::QueuePush {
                key: k("/q"),
                value: k("v"),
            },
            Request::QueuePop { key: k("/q") },
            Request::QueueLen { key: k("/q") },
            Request::ListKeys,
            Request::Barrier {
                key: k("/b"),
                world_size: 3,
            },
        ]
    }

    #[test]
    fn every_request_round_trips_and_reports_incomplete_prefixes() {
        for req in all_requests() {
            let wire = req.encode();
            assert_eq!(
                Request::parse(&wire),
                Ok(Some((req.clone(), wire.len()))),
                "{req:?}"
            );
            for cut in 0..wire.len() {
                assert_eq!(
                    Request::parse(&wire[..cut]),
                    Ok(None),
                    "{req:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn bytes_match_what_torch_sends() {
        // Captured from torch 2.15's client: `store.set("k", "v")` and the connect handshake.
        let set = Request::Set {
            key: b"/k".to_vec(),
            value: b"v".to_vec(),
        }
        .encode();
        assert_eq!(set, hex("0102000000000000002f6b010000000000000076"));
        let validate = Request::Validate {
            magic: VALIDATION_MAGIC,
        }
        .encode();
        assert_eq!(validate, hex("00cef7853c"));
        let add = Request::Add {
            key: b"/c".to_vec(),
            delta: 5,
        }
        .encode();
        assert_eq!(add, hex("0402000000000000002f630500000000000000"));
    }

    #[test]
    fn garbage_is_an_error_not_a_hang() {
        assert!(Request::parse(&[200]).is_err());
        let mut huge_key = vec![Query::Get as u8];
        huge_key.extend_from_slice(&(MAX_KEY_LEN + 1).to_le_bytes());
        assert!(Request::parse(&huge_key).is_err());
        let mut many = vec![Query::Wait as u8];
        many.extend_from_slice(&u64::MAX.to_le_bytes());
        assert!(Request::parse(&many).is_err());
    }

    #[test]
    fn pipelined_requests_parse_one_at_a_time() {
        let mut wire = Request::GetNumKeys.encode();
        wire.extend(Request::Ping { nonce: 9 }.encode());
        let (first, used) = Request::parse(&wire).unwrap().unwrap();
        assert_eq!(first, Request::GetNumKeys);
        let (second, used2) = Request::parse(&wire[used..]).unwrap().unwrap();
        assert_eq!(second, Request::Ping { nonce: 9 });
        assert_eq!(used + used2, wire.len());
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
}
