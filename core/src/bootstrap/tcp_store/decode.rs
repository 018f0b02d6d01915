//! Incremental decoding of requests, for the server.
//!
//! Requests arrive in pieces; a decoder that starts over from the first byte on every wake-up
//! costs O(n²) for a request that trickles in (a `MULTI_SET` of many keys, sent slowly by many
//! connections, slowed every other client down by seconds). [`Decoder`] instead consumes each
//! complete field as it arrives and keeps what it decoded, so each byte is looked at once; a
//! field still in flight (a long value) only costs a length comparison per wake-up.
//!
//! The decoder also knows how many bytes the request in progress holds and has announced
//! ([`Decoder::claim`]), so the server can charge them to its memory quota before they arrive.

use super::protocol::{ProtocolError, Query, Request, MAX_KEY_COUNT, MAX_KEY_LEN};

/// One argument of a request, in wire order.
#[derive(Debug, Clone, Copy)]
enum Field {
    U32,
    I64,
    Key,
    Value,
    /// A count, then that many keys.
    Keys,
    /// A count, then that many (key, value) pairs.
    Pairs,
}

fn schema(q: Query) -> &'static [Field] {
    use Field::*;
    match q {
        Query::Validate | Query::Ping => &[U32],
        Query::Set | Query::Append | Query::QueuePush => &[Key, Value],
        Query::CompareSet => &[Key, Value, Value],
        Query::Get | Query::DeleteKey | Query::QueuePop | Query::QueueLen => &[Key],
        Query::Add | Query::Barrier => &[Key, I64],
        Query::Check | Query::Wait | Query::MultiGet => &[Keys],
        Query::MultiSet => &[Pairs],
        Query::GetNumKeys | Query::CancelWait | Query::ListKeys => &[],
    }
}

/// A decoded argument.
#[derive(Debug)]
enum Item {
    Int(u64),
    Bytes(Vec<u8>),
    Keys(Vec<Vec<u8>>),
    Pairs(Vec<(Vec<u8>, Vec<u8>)>),
}

/// The request in progress.
#[derive(Debug)]
struct Partial {
    query: Query,
    /// Index of the field being decoded.
    field: usize,
    items: Vec<Item>,
    /// Count of the list field being decoded, once read.
    count: Option<u64>,
    keys: Vec<Vec<u8>>,
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Key of a pair whose value has not arrived.
    half: Option<Vec<u8>>,
    /// Announced length of the byte string being received.
    len: Option<u64>,
    /// Bytes of the keys and values decoded so far.
    held: usize,
}

/// Decodes requests from successive slices of a connection's bytes.
#[derive(Debug)]
pub(crate) struct Decoder {
    max_value: u64,
    partial: Option<Partial>,
}

/// What [`Decoder::feed`] did: bytes consumed (drop them from the buffer) and the request it
/// completed, if any.
pub(crate) type Fed = (usize, Option<Request>);

impl Decoder {
    /// A decoder refusing values above `max_value` bytes.
    pub(crate) fn new(max_value: u64) -> Decoder {
        Decoder {
            max_value,
            partial: None,
        }
    }

    /// Bytes of the keys and values of the request in progress decoded so far.
    pub(crate) fn held(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.held)
    }

    /// Length of the byte string being received, once its length arrived.
    pub(crate) fn announced(&self) -> usize {
        self.partial
            .as_ref()
            .and_then(|p| p.len)
            .map_or(0, |l| usize::try_from(l).unwrap_or(usize::MAX))
    }

    /// Bytes the decoder needs in the buffer before it can make progress (so the connection
    /// can read that much and no more).
    pub(crate) fn want(&self) -> usize {
        self.partial
            .as_ref()
            .and_then(|p| p.len)
            .map_or(8, |l| usize::try_from(l).unwrap_or(usize::MAX))
    }

    /// True when no request is in progress.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> bool {
        self.partial.is_none()
    }

    /// Consumes complete fields from `buf`, stopping after one complete request.
    pub(crate) fn feed(&mut self, buf: &[u8]) -> Result<Fed, ProtocolError> {
        let mut pos = 0;
        if self.partial.is_none() {
            let Some(&cmd) = buf.first() else {
                return Ok((0, None));
            };
            let query = Query::from_u8(cmd)
                .ok_or_else(|| ProtocolError(format!("unknown command byte {cmd}")))?;
            pos = 1;
            self.partial = Some(Partial {
                query,
                field: 0,
                items: Vec::new(),
                count: None,
                keys: Vec::new(),
                pairs: Vec::new(),
                half: None,
                len: None,
                held: 0,
            });
        }
        let p = self.partial.as_mut().expect("set above");
        let done = p.advance(buf, &mut pos, self.max_value)?;
        if !done {
            return Ok((pos, None));
        }
        let p = self.partial.take().expect("in progress");
        Ok((pos, Some(p.finish())))
    }
}

impl Partial {
    /// Decodes fields from `buf[*pos..]`; true once the last field is decoded.
    fn advance(
        &mut self,
        buf: &[u8],
        pos: &mut usize,
        max_value: u64,
    ) -> Result<bool, ProtocolError> {
        let fields = schema(self.query);
        while let Some(&field) = fields.get(self.field) {
            match field {
                Field::U32 => match take(buf, pos, 4) {
                    Some(b) => self.items.push(Item::Int(u64::from(u32::from_le_bytes(
                        b.try_into().expect("4 bytes"),
                    )))),
                    None => return Ok(false),
                },
                Field::I64 => match take(buf, pos, 8) {
                    Some(b) => self.items.push(Item::Int(u64::from_le_bytes(
                        b.try_into().expect("8 bytes"),
                    ))),
                    None => return Ok(false),
                },
                Field::Key | Field::Value => {
                    let max = if matches!(field, Field::Key) {
                        MAX_KEY_LEN
                    } else {
                        max_value
                    };
                    match self.bytes(buf, pos, field, max)? {
                        Some(v) => self.items.push(Item::Bytes(v)),
                        None => return Ok(false),
                    }
                }
                Field::Keys | Field::Pairs => {
                    let n = match self.count {
                        Some(n) => n,
                        None => {
                            let Some(b) = take(buf, pos, 8) else {
                                return Ok(false);
                            };
                            let n = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                            if n > MAX_KEY_COUNT {
                                return Err(ProtocolError(format!(
                                    "{n} keys in one request exceeds {MAX_KEY_COUNT}"
                                )));
                            }
                            self.count = Some(n);
                            n
                        }
                    };
                    let pairs = matches!(field, Field::Pairs);
                    loop {
                        let got = if pairs {
                            self.pairs.len()
                        } else {
                            self.keys.len()
                        };
                        if got as u64 == n {
                            break;
                        }
                        if pairs && self.half.is_some() {
                            let Some(v) = self.bytes(buf, pos, Field::Value, max_value)? else {
                                return Ok(false);
                            };
                            let k = self.half.take().expect("checked");
                            self.pairs.push((k, v));
                        } else {
                            let Some(k) = self.bytes(buf, pos, Field::Key, MAX_KEY_LEN)? else {
                                return Ok(false);
                            };
                            if pairs {
                                self.half = Some(k);
                            } else {
                                self.keys.push(k);
                            }
                        }
                    }
                    self.count = None;
                    self.items.push(if pairs {
                        Item::Pairs(std::mem::take(&mut self.pairs))
                    } else {
                        Item::Keys(std::mem::take(&mut self.keys))
                    });
                }
            }
            self.field += 1;
        }
        Ok(true)
    }

    /// A length-prefixed byte string: the length is consumed (and checked) as soon as it
    /// arrives, the bytes once all of them did.
    fn bytes(
        &mut self,
        buf: &[u8],
        pos: &mut usize,
        field: Field,
        max: u64,
    ) -> Result<Option<Vec<u8>>, ProtocolError> {
        let len = match self.len {
            Some(l) => l,
            None => {
                let Some(b) = take(buf, pos, 8) else {
                    return Ok(None);
                };
                let l = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                if l > max {
                    let what = if matches!(field, Field::Key) {
                        "key"
                    } else {
                        "value"
                    };
                    let limit = if matches!(field, Field::Key) {
                        String::new()
                    } else {
                        " (TORCHCOMMS_STORE_MAX_VALUE_BYTES)".to_string()
                    };
                    return Err(ProtocolError(format!(
                        "{what} of {l} bytes exceeds the limit of {max}{limit}"
                    )));
                }
                self.len = Some(l);
                l
            }
        };
        let Some(b) = take(buf, pos, len as usize) else {
            return Ok(None);
        };
        self.len = None;
        self.held += b.len();
        Ok(Some(b.to_vec()))
    }

    fn finish(self) -> Request {
        let mut f = Fields(self.items.into_iter());
        match self.query {
            Query::Validate => Request::Validate {
                magic: f.int() as u32,
            },
            Query::Ping => Request::Ping {
                nonce: f.int() as u32,
            },
            Query::Set => Request::Set {
                key: f.bytes(),
                value: f.bytes(),
            },
            Query::Append => Request::Append {
                key: f.bytes(),
                value: f.bytes(),
            },
            Query::QueuePush => Request::QueuePush {
                key: f.bytes(),
                value: f.bytes(),
            },
            Query::CompareSet => Request::CompareSet {
                key: f.bytes(),
                expected: f.bytes(),
                desired: f.bytes(),
            },
            Query::Get => Request::Get { key: f.bytes() },
            Query::DeleteKey => Request::DeleteKey { key: f.bytes() },
            Query::QueuePop => Request::QueuePop { key: f.bytes() },
            Query::QueueLen => Request::QueueLen { key: f.bytes() },
            Query::Add => Request::Add {
                key: f.bytes(),
                delta: f.int() as i64,
            },
            Query::Barrier => Request::Barrier {
                key: f.bytes(),
                world_size: f.int() as i64,
            },
            Query::Check => Request::Check { keys: f.keys() },
            Query::Wait => Request::Wait { keys: f.keys() },
            Query::MultiGet => Request::MultiGet { keys: f.keys() },
            Query::MultiSet => Request::MultiSet { pairs: f.pairs() },
            Query::GetNumKeys => Request::GetNumKeys,
            Query::CancelWait => Request::CancelWait,
            Query::ListKeys => Request::ListKeys,
        }
    }
}

/// The decoded fields of a finished request, taken in schema order.
struct Fields(std::vec::IntoIter<Item>);

impl Fields {
    fn next(&mut self) -> Item {
        self.0
            .next()
            .expect("every field of the schema was decoded")
    }

    fn int(&mut self) -> u64 {
        match self.next() {
            Item::Int(v) => v,
            other => unreachable!("schema says an integer, decoded {other:?}"),
        }
    }

    fn bytes(&mut self) -> Vec<u8> {
        match self.next() {
            Item::Bytes(b) => b,
            other => unreachable!("schema says bytes, decoded {other:?}"),
        }
    }

    fn keys(&mut self) -> Vec<Vec<u8>> {
        match self.next() {
            Item::Keys(k) => k,
            other => unreachable!("schema says keys, decoded {other:?}"),
        }
    }

    fn pairs(&mut self) -> Vec<(Vec<u8>, Vec<u8>)> {
        match self.next() {
            Item::Pairs(p) => p,
            other => unreachable!("schema says pairs, decoded {other:?}"),
        }
    }
}

/// `n` bytes at `*pos`, advancing it; `None` when fewer are there.
fn take<'a>(buf: &'a [u8], pos: &mut usize, n: usize) -> Option<&'a [u8]> {
    let end = pos.checked_add(n)?;
    let b = buf.get(*pos..end)?;
    *pos = end;
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fed one byte at a time, a long request is decoded with each byte consumed once: the
    /// buffer never holds more than the field in flight.
    #[test]
    fn a_request_fed_byte_by_byte_is_decoded_without_rereading() {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..50)
            .map(|i| (format!("/k{i}").into_bytes(), vec![i as u8; i]))
            .collect();
        let req = Request::MultiSet { pairs };
        let wire = req.encode();
        let mut d = Decoder::new(1 << 20);
        let mut buf: Vec<u8> = Vec::new();
        let mut longest = 0;
        let mut got = None;
        for &b in &wire {
            buf.push(b);
            longest = longest.max(buf.len());
            let (used, done) = d.feed(&buf).unwrap();
            buf.drain(..used);
            if done.is_some() {
                got = done;
            }
        }
        assert_eq!(got, Some(req));
        assert!(buf.is_empty() && d.idle());
        assert!(longest <= 50, "held {longest} bytes at once");
    }

    #[test]
    fn an_announced_value_is_claimed_before_it_arrives_and_limits_name_the_cvar() {
        let mut d = Decoder::new(1000);
        let mut wire = vec![Query::Set as u8];
        wire.extend(2u64.to_le_bytes());
        wire.extend(b"/k");
        wire.extend(900u64.to_le_bytes());
        let (used, done) = d.feed(&wire).unwrap();
        assert_eq!((used, done), (wire.len(), None));
        assert_eq!((d.held(), d.announced(), d.want()), (2, 900, 900));
        let mut big = vec![Query::Set as u8];
        big.extend(2u64.to_le_bytes());
        big.extend(b"/k");
        big.extend(1001u64.to_le_bytes());
        let e = Decoder::new(1000).feed(&big).unwrap_err().0;
        assert!(e.contains("TORCHCOMMS_STORE_MAX_VALUE_BYTES"), "{e}");
    }
}
