//! Control messages of the ib transport: fixed [`SLOT`]-byte records a rank RDMA-writes (with
//! a notification) into a ring the peer registered for it. The peer reads message `n` from slot
//! `n % RING_SLOTS` when its virtual QP reports notification `n`; notifications come in posting
//! order, so the ring is read in order.
//!
//! Layout (little-endian): byte 0 the kind, bytes 4..8 the low 32 bits of the message number
//! (checked by the reader), bytes 8..16 how many of the peer's messages the writer consumed
//! (credits), bytes 16..64 the kind's fields.

use crate::transport::OpTag;

/// Bytes of one control message.
pub(crate) const SLOT: usize = 64;
/// Slots of a ring (per peer and direction). A writer keeps at most `RING_SLOTS - 1` ordinary
/// messages unconsumed; the last slot is kept for a credit message, so two ranks that both ran
/// out of room can always tell each other what they consumed.
pub(crate) const RING_SLOTS: u64 = 64;
/// Longest abort reason carried (longer ones are cut).
const REASON_BYTES: usize = SLOT - 17;

/// One control message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ctl {
    /// Only the credits (also sent as a keep-alive: a write to a peer that is gone fails).
    Credit,
    /// Clear to send: receive `rid` of `len` bytes for operation `tag` waits in the staging
    /// registration at `addr`/`rkey`.
    Cts {
        rid: u64,
        tag: OpTag,
        len: u64,
        addr: u64,
        rkey: u32,
    },
    /// The data for receive `rid` is in place; `ack`: the sender waits for an [`Ctl::Ack`].
    Data { rid: u64, ack: bool },
    /// The sender refused receive `rid`: its send is of operation `tag` and `len` bytes.
    Nack { rid: u64, tag: OpTag, len: u64 },
    /// Receive `rid` accepted its data.
    Ack { rid: u64 },
    /// `len` bytes at `offset` of region `region` (id and generation) were written.
    Put { region: u64, offset: u64, len: u64 },
    /// Add `add` to the signal (or fence) counter region `region` keeps for the writer.
    Signal { region: u64, fence: bool, add: u64 },
    /// The writer aborted or refused something of this rank, and will not go on.
    Abort { reason: String },
    /// The writer finished normally and is closing its connections: a write to it that fails
    /// from now on is no failure.
    Bye,
}

const CREDIT: u8 = 1;
const CTS: u8 = 2;
const DATA: u8 = 3;
const NACK: u8 = 4;
const ACK: u8 = 5;
const PUT: u8 = 6;
const SIGNAL: u8 = 7;
const ABORT: u8 = 8;
const BYE: u8 = 9;

fn put64(b: &mut [u8; SLOT], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn get64(b: &[u8; SLOT], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn get32(b: &[u8; SLOT], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Ctl {
    /// Encodes message number `n`, saying that `acked` of the peer's messages were consumed.
    pub(crate) fn encode(&self, n: u64, acked: u64) -> [u8; SLOT] {
        let mut b = [0u8; SLOT];
        b[4..8].copy_from_slice(&(n as u32).to_le_bytes());
        put64(&mut b, 8, acked);
        b[0] = match self {
            Ctl::Credit => CREDIT,
            Ctl::Cts {
                rid,
                tag,
                len,
                addr,
                rkey,
            } => {
                put64(&mut b, 16, *rid);
                put64(&mut b, 24, tag.word);
                put64(&mut b, 32, tag.seq);
                put64(&mut b, 40, *len);
                put64(&mut b, 48, *addr);
                b[56..60].copy_from_slice(&rkey.to_le_bytes());
                CTS
            }
            Ctl::Data { rid, ack } => {
                put64(&mut b, 16, *rid);
                b[24] = u8::from(*ack);
                DATA
            }
            Ctl::Nack { rid, tag, len } => {
                put64(&mut b, 16, *rid);
                put64(&mut b, 24, tag.word);
                put64(&mut b, 32, tag.seq);
                put64(&mut b, 40, *len);
                NACK
            }
            Ctl::Ack { rid } => {
                put64(&mut b, 16, *rid);
                ACK
            }
            Ctl::Put {
                region,
                offset,
                len,
            } => {
                put64(&mut b, 16, *region);
                put64(&mut b, 24, *offset);
                put64(&mut b, 32, *len);
                PUT
            }
            Ctl::Signal { region, fence, add } => {
                put64(&mut b, 16, *region);
                put64(&mut b, 24, *add);
                b[32] = u8::from(*fence);
                SIGNAL
            }
            Ctl::Abort { reason } => {
                let mut cut = reason.len().min(REASON_BYTES);
                while !reason.is_char_boundary(cut) {
                    cut -= 1;
                }
                b[16] = cut as u8;
                b[17..17 + cut].copy_from_slice(&reason.as_bytes()[..cut]);
                ABORT
            }
            Ctl::Bye => BYE,
        };
        b
    }

    /// Decodes message number `n`; returns it with the writer's consumed count, or why the
    /// slot does not hold message `n`.
    pub(crate) fn decode(b: &[u8; SLOT], n: u64) -> Result<(Ctl, u64), String> {
        if get32(b, 4) != n as u32 {
            return Err(format!(
                "control slot holds message {} where {} was notified",
                get32(b, 4),
                n as u32
            ));
        }
        let tag = |at: usize| OpTag {
            word: get64(b, at),
            seq: get64(b, at + 8),
        };
        let ctl = match b[0] {
            CREDIT => Ctl::Credit,
            CTS => Ctl::Cts {
                rid: get64(b, 16),
                tag: tag(24),
                len: get64(b, 40),
                addr: get64(b, 48),
                rkey: get32(b, 56),
            },
            DATA => Ctl::Data {
                rid: get64(b, 16),
                ack: b[24] != 0,
            },
            NACK => Ctl::Nack {
                rid: get64(b, 16),
                tag: tag(24),
                len: get64(b, 40),
            },
            ACK => Ctl::Ack { rid: get64(b, 16) },
            PUT => Ctl::Put {
                region: get64(b, 16),
                offset: get64(b, 24),
                len: get64(b, 32),
            },
            SIGNAL => Ctl::Signal {
                region: get64(b, 16),
                add: get64(b, 24),
                fence: b[32] != 0,
            },
            ABORT => {
                let n = usize::from(b[16]).min(REASON_BYTES);
                Ctl::Abort {
                    reason: String::from_utf8_lossy(&b[17..17 + n]).into_owned(),
                }
            }
            BYE => Ctl::Bye,
            k => return Err(format!("unknown control message kind {k}")),
        };
        Ok((ctl, get64(b, 8)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_survives_its_slot() {
        let tag = OpTag {
            word: 0x1234,
            seq: 9,
        };
        let all = [
            Ctl::Credit,
            Ctl::Cts {
                rid: 5,
                tag,
                len: 1 << 40,
                addr: 0xdead_0000,
                rkey: 77,
            },
            Ctl::Data { rid: 6, ack: true },
            Ctl::Nack {
                rid: 7,
                tag,
                len: 3,
            },
            Ctl::Ack { rid: 8 },
            Ctl::Bye,
            Ctl::Put {
                region: 1 << 33,
                offset: 10,
                len: 20,
            },
            Ctl::Signal {
                region: 3,
                fence: true,
                add: 2,
            },
            Ctl::Abort {
                reason: "short".into(),
            },
        ];
        for (n, c) in all.iter().enumerate() {
            let b = c.encode(n as u64, 42);
            assert_eq!(Ctl::decode(&b, n as u64), Ok((c.clone(), 42)));
            assert!(Ctl::decode(&b, n as u64 + 1).is_err());
        }
        let long = Ctl::Abort {
            reason: "é".repeat(40),
        };
        let (back, _) = Ctl::decode(&long.encode(0, 0), 0).unwrap();
        let Ctl::Abort { reason } = back else {
            panic!()
        };
        assert!(reason.len() <= REASON_BYTES && reason.chars().all(|c| c == 'é'));
    }
}
