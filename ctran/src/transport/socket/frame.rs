//! The 32-byte header that precedes every message on a TCP connection: magic, flags, length and
//! the sender's [`OpTag`], so a receiver can check that the sender runs the same operation and
//! agrees about the size before it takes the data as valid. The decoder is the one place that
//! interprets bytes a peer wrote; it never trusts them beyond returning what they announce.

use bytemuck::{Pod, Zeroable};

use crate::transport::OpTag;

/// Bytes of a header on the wire.
pub const HEADER_LEN: usize = 32;
const MAGIC: u32 = 0x7C7C_0D47;
/// Flag: the payload is a failing peer's last words (UTF-8), not data.
const FLAG_ABORT: u32 = 1;
/// Flag: the peer finalized and closes; it sends nothing more.
const FLAG_BYE: u32 = 2;
/// Flag: the peer has waited a while for this rank in the operation its tag names; nothing
/// follows. Lets ranks that disagree about a root (so that no data ever flows) find out.
const FLAG_PROBE: u32 = 4;
/// Flag of a data frame: the sender waits for an [`Frame::Ack`] once the receiver checked it.
const FLAG_CONFIRM: u32 = 8;
/// Flag: the receiver accepted the oldest confirmed message it had not acknowledged yet.
const FLAG_ACK: u32 = 16;
/// Flag: a one-sided write of `len` bytes into a registered region of the receiver; the tag
/// fields carry the region's id and generation and the byte offset.
const FLAG_PUT: u32 = 32;
/// Flag: adds to the signal counter the receiver's region keeps for the sender; nothing
/// follows.
const FLAG_SIGNAL: u32 = 64;
/// Flag: the sender's fence for a region being deregistered; nothing follows.
const FLAG_FENCE: u32 = 128;
/// Longest abort reason sent or read.
pub const MAX_REASON: usize = 1024;

/// A header as it is on the wire: every field little-endian.
#[repr(C)]
#[derive(Debug, Clone, Copy, Pod, Zeroable)]
struct Header {
    magic: u32,
    flags: u32,
    /// Payload bytes.
    len: u64,
    /// The sender's operation ([`OpTag::word`]).
    tag_word: u64,
    /// Its sequence number ([`OpTag::seq`]).
    tag_seq: u64,
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_LEN);

/// What a header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// `len` payload bytes of the operation `tag`.
    Data {
        /// Payload bytes that follow.
        len: u64,
        /// The sender's operation.
        tag: OpTag,
        /// The sender waits for an [`Frame::Ack`] once the receiver accepted the header.
        confirm: bool,
    },
    /// A failing peer's reason: `len` bytes of UTF-8 follow.
    Abort {
        /// Reason bytes that follow (at most [`MAX_REASON`] are read).
        len: u64,
    },
    /// The peer finalized: it sends nothing more.
    Bye,
    /// The peer waits for this rank in the operation `tag`; nothing follows.
    Probe {
        /// What the peer runs.
        tag: OpTag,
    },
    /// The peer accepted this rank's oldest unacknowledged confirmed message (of `tag`).
    Ack {
        /// The operation of the message it accepted.
        tag: OpTag,
    },
    /// `len` bytes follow, to be written at byte `offset` of the region `region` names (its id
    /// and generation, [`crate::transport::region::RemoteKey::region_word`]) once checked.
    Put {
        /// Payload bytes that follow.
        len: u64,
        /// The target region's id and generation.
        region: u64,
        /// Byte offset in the region.
        offset: u64,
    },
    /// Adds `add` to the counter the region keeps for the sender; nothing follows.
    Signal {
        /// The target region's id and generation.
        region: u64,
        /// What to add.
        add: u64,
    },
    /// The sender's fence for the region (deregistration); nothing follows.
    Fence {
        /// The target region's id and generation.
        region: u64,
    },
}

/// The header of `frame`.
pub fn encode(frame: Frame) -> [u8; HEADER_LEN] {
    let (flags, len, tag) = match frame {
        Frame::Data { len, tag, confirm } => (if confirm { FLAG_CONFIRM } else { 0 }, len, tag),
        Frame::Abort { len } => (FLAG_ABORT, len, OpTag::default()),
        Frame::Bye => (FLAG_BYE, 0, OpTag::default()),
        Frame::Probe { tag } => (FLAG_PROBE, 0, tag),
        Frame::Ack { tag } => (FLAG_ACK, 0, tag),
        Frame::Put {
            len,
            region,
            offset,
        } => (FLAG_PUT, len, raw_tag(region, offset)),
        Frame::Signal { region, add } => (FLAG_SIGNAL, 0, raw_tag(region, add)),
        Frame::Fence { region } => (FLAG_FENCE, 0, raw_tag(region, 0)),
    };
    bytemuck::cast(Header {
        magic: MAGIC.to_le(),
        flags: flags.to_le(),
        len: len.to_le(),
        tag_word: tag.word.to_le(),
        tag_seq: tag.seq.to_le(),
    })
}

/// The tag fields of a one-sided frame: they carry the region and an offset or amount.
fn raw_tag(word: u64, seq: u64) -> OpTag {
    OpTag { word, seq }
}

/// Reads a header a peer sent. Fails, naming what is wrong, on a bad magic number, unknown
/// flags, or a control frame that announces a payload it may not have.
pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Frame, String> {
    let h: Header = bytemuck::cast(*bytes);
    let magic = u32::from_le(h.magic);
    if magic != MAGIC {
        return Err(format!("corrupt stream (bad magic {magic:#x})"));
    }
    let len = u64::from_le(h.len);
    let tag = OpTag {
        word: u64::from_le(h.tag_word),
        seq: u64::from_le(h.tag_seq),
    };
    match u32::from_le(h.flags) {
        flags @ (0 | FLAG_CONFIRM) => Ok(Frame::Data {
            len,
            tag,
            confirm: flags == FLAG_CONFIRM,
        }),
        FLAG_ABORT => Ok(Frame::Abort { len }),
        FLAG_BYE | FLAG_PROBE | FLAG_ACK | FLAG_SIGNAL | FLAG_FENCE if len != 0 => Err(format!(
            "corrupt stream (a control frame announcing {len} payload bytes)"
        )),
        FLAG_BYE => Ok(Frame::Bye),
        FLAG_PROBE => Ok(Frame::Probe { tag }),
        FLAG_ACK => Ok(Frame::Ack { tag }),
        FLAG_PUT => Ok(Frame::Put {
            len,
            region: tag.word,
            offset: tag.seq,
        }),
        FLAG_SIGNAL => Ok(Frame::Signal {
            region: tag.word,
            add: tag.seq,
        }),
        FLAG_FENCE => Ok(Frame::Fence { region: tag.word }),
        flags => Err(format!("corrupt stream (unknown flags {flags:#x})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_keeps_its_wire_layout() {
        let tag = OpTag {
            word: 0x1122,
            seq: 0x3344,
        };
        let h = encode(Frame::Data {
            len: 0x0102_0304_0506,
            tag,
            confirm: false,
        });
        let mut want = [0u8; HEADER_LEN];
        want[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        want[8..16].copy_from_slice(&0x0102_0304_0506u64.to_le_bytes());
        want[16..24].copy_from_slice(&0x1122u64.to_le_bytes());
        want[24..32].copy_from_slice(&0x3344u64.to_le_bytes());
        assert_eq!(h, want);
    }

    #[test]
    fn every_frame_decodes_to_itself() {
        let tag = OpTag { word: 7, seq: 9 };
        for f in [
            Frame::Data {
                len: 5,
                tag,
                confirm: false,
            },
            Frame::Data {
                len: 0,
                tag,
                confirm: true,
            },
            Frame::Abort { len: 12 },
            Frame::Bye,
            Frame::Probe { tag },
            Frame::Ack { tag },
            Frame::Put {
                len: 3,
                region: 1 << 32 | 2,
                offset: 5,
            },
            Frame::Signal { region: 4, add: 1 },
            Frame::Fence { region: 4 },
        ] {
            assert_eq!(decode(&encode(f)), Ok(f));
        }
    }

    #[test]
    fn foreign_bytes_are_refused_naming_the_problem() {
        assert!(decode(&[0; HEADER_LEN]).unwrap_err().contains("bad magic"));
        let mut h = encode(Frame::Bye);
        h[5] = 0x10;
        assert!(decode(&h).unwrap_err().contains("unknown flags"));
        let mut h = encode(Frame::Probe {
            tag: OpTag::default(),
        });
        h[8] = 1;
        assert!(decode(&h).unwrap_err().contains("control frame"));
    }
}
