//! Frames of the transfer protocol. Both directions carry requests (this side's writes and
//! reads) and responses (to the peer's); a payload, when there is one, follows its frame on
//! the stream as raw bytes.

use std::io::{self, Read};

use ibverbx::RemoteKey as IbKey;
use torchcomms_cuda::ipc::HANDLE_BYTES;

/// Largest frame body (keys and error texts are short; payloads are not in frames).
const MAX_BODY: u32 = 64 * 1024;

/// How the data of a request moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Via {
    /// As a payload on the stream (after a write request, after a read's response).
    Payload,
    /// The target copies with cross-memory attach from/to `addr` in process `pid`.
    Cma {
        /// The requester's pid.
        pid: u32,
        /// The requester's local address.
        addr: u64,
    },
    /// Requester and target are one process (two transports connected to each other): the
    /// target copies device to device from/to `addr` directly (CUDA IPC handles cannot be
    /// opened by the process that exported them). Only honoured on a connection whose other
    /// end this process holds.
    Local {
        /// The requester's device address.
        addr: u64,
    },
    /// The target maps the requester's CUDA allocation and copies device to device.
    Ipc {
        /// The allocation's IPC handle.
        handle: [u8; HANDLE_BYTES],
        /// Its buffer id (cache key at the target).
        buffer_id: u64,
        /// Offset of the requester's range inside the allocation.
        offset: u64,
    },
    /// The ib data path: a write's bytes are in the target's write inbox, or the target puts
    /// a read's bytes into the requester's read inbox (`ib_path.rs`). At most one chunk.
    Ib,
    /// The ib data path in place: the requester's range is registered with its NIC as `key`;
    /// the target reads it into (a write) or writes into it from (a read) its own range.
    IbDirect {
        /// The requester's range, as its NIC names it (exactly the transfer's length).
        key: IbKey,
    },
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Frame {
    /// Write `len` bytes into the peer's registration at `dst`.
    Write {
        req: u64,
        key: String,
        dst: u64,
        len: u64,
        notify: bool,
        via: Via,
    },
    /// Read `len` bytes of the peer's registration at `src`.
    Read {
        req: u64,
        key: String,
        src: u64,
        len: u64,
        via: Via,
    },
    /// The answer to request `req`; `payload` bytes follow (a read over the stream).
    Response {
        req: u64,
        status: Status,
        text: String,
        payload: u64,
    },
}

/// Outcome of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Done.
    Ok,
    /// Refused or failed; the text says why.
    Failed,
    /// Cross-memory attach is not permitted between the two processes: use the stream.
    CmaDenied,
    /// The target cannot register its memory with its NIC in place: stage through the
    /// inboxes (the text says why).
    NoDirect,
}

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn str(&mut self, s: &str) {
        let b = &s.as_bytes()[..s.len().min(16 * 1024)];
        self.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.0.extend_from_slice(b);
    }
    fn via(&mut self, v: &Via) {
        match v {
            Via::Payload => self.u8(0),
            Via::Cma { pid, addr } => {
                self.u8(1);
                self.u64(u64::from(*pid));
                self.u64(*addr);
            }
            Via::Local { addr } => {
                self.u8(3);
                self.u64(*addr);
            }
            Via::Ipc {
                handle,
                buffer_id,
                offset,
            } => {
                self.u8(2);
                self.0.extend_from_slice(handle);
                self.u64(*buffer_id);
                self.u64(*offset);
            }
            Via::Ib => self.u8(4),
            Via::IbDirect { key } => {
                self.u8(5);
                self.0.extend_from_slice(&key.to_bytes());
            }
        }
    }
}

struct Dec<'a>(&'a [u8]);

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed frame: {what}"),
    )
}

impl Dec<'_> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if self.0.len() < n {
            return Err(bad("truncated"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A boolean: exactly 0 or 1 (every frame has one encoding).
    fn flag(&mut self) -> io::Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(bad("a flag is neither 0 nor 1")),
        }
    }
    fn str(&mut self) -> io::Result<String> {
        let n = u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")) as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| bad("text is not UTF-8"))
    }
    fn via(&mut self) -> io::Result<Via> {
        Ok(match self.u8()? {
            0 => Via::Payload,
            1 => Via::Cma {
                pid: u32::try_from(self.u64()?).map_err(|_| bad("pid"))?,
                addr: self.u64()?,
            },
            3 => Via::Local { addr: self.u64()? },
            2 => Via::Ipc {
                handle: self.take(HANDLE_BYTES)?.try_into().expect("handle bytes"),
                buffer_id: self.u64()?,
                offset: self.u64()?,
            },
            4 => Via::Ib,
            5 => Via::IbDirect {
                key: IbKey::from_bytes(self.take(IbKey::BYTES)?).map_err(|_| bad("ib key"))?,
            },
            _ => return Err(bad("unknown data path")),
        })
    }
}

impl Frame {
    /// A write request (`write`) of `len` bytes into the peer's registration `key` at `at`,
    /// or a read request of them; `notify` counts for writes only.
    pub(crate) fn request(
        write: bool,
        req: u64,
        key: String,
        at: u64,
        len: u64,
        notify: bool,
        via: Via,
    ) -> Frame {
        if write {
            Frame::Write {
                req,
                key,
                dst: at,
                len,
                notify,
                via,
            }
        } else {
            Frame::Read {
                req,
                key,
                src: at,
                len,
                via,
            }
        }
    }

    /// The frame's bytes, length-prefixed.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc::default();
        match self {
            Frame::Write {
                req,
                key,
                dst,
                len,
                notify,
                via,
            } => {
                e.u8(1);
                e.u64(*req);
                e.str(key);
                e.u64(*dst);
                e.u64(*len);
                e.u8(u8::from(*notify));
                e.via(via);
            }
            Frame::Read {
                req,
                key,
                src,
                len,
                via,
            } => {
                e.u8(2);
                e.u64(*req);
                e.str(key);
                e.u64(*src);
                e.u64(*len);
                e.via(via);
            }
            Frame::Response {
                req,
                status,
                text,
                payload,
            } => {
                e.u8(3);
                e.u64(*req);
                e.u8(match status {
                    Status::Ok => 0,
                    Status::Failed => 1,
                    Status::CmaDenied => 2,
                    Status::NoDirect => 3,
                });
                e.str(text);
                e.u64(*payload);
            }
        }
        let mut out = (e.0.len() as u32).to_le_bytes().to_vec();
        out.extend_from_slice(&e.0);
        out
    }

    /// Reads one frame (not its payload).
    pub(crate) fn recv(r: &mut impl Read) -> io::Result<Frame> {
        let mut n = [0u8; 4];
        r.read_exact(&mut n)?;
        let n = u32::from_le_bytes(n);
        if n > MAX_BODY {
            return Err(bad("too long"));
        }
        let mut body = vec![0u8; n as usize];
        r.read_exact(&mut body)?;
        let mut d = Dec(&body);
        let f = match d.u8()? {
            1 => Frame::Write {
                req: d.u64()?,
                key: d.str()?,
                dst: d.u64()?,
                len: d.u64()?,
                notify: d.flag()?,
                via: d.via()?,
            },
            2 => Frame::Read {
                req: d.u64()?,
                key: d.str()?,
                src: d.u64()?,
                len: d.u64()?,
                via: d.via()?,
            },
            3 => Frame::Response {
                req: d.u64()?,
                status: match d.u8()? {
                    0 => Status::Ok,
                    1 => Status::Failed,
                    2 => Status::CmaDenied,
                    3 => Status::NoDirect,
                    _ => return Err(bad("unknown status")),
                },
                text: d.str()?,
                payload: d.u64()?,
            },
            _ => return Err(bad("unknown kind")),
        };
        if !d.0.is_empty() {
            return Err(bad("trailing bytes"));
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        for f in [
            Frame::Write {
                req: 1,
                key: "ab".into(),
                dst: 2,
                len: 3,
                notify: true,
                via: Via::Cma { pid: 9, addr: 10 },
            },
            Frame::Read {
                req: 11,
                key: "cd".into(),
                src: 12,
                len: 13,
                via: Via::Local { addr: 14 },
            },
            Frame::Read {
                req: 4,
                key: String::new(),
                src: 5,
                len: 6,
                via: Via::Ipc {
                    handle: [3; HANDLE_BYTES],
                    buffer_id: 7,
                    offset: 8,
                },
            },
            Frame::Write {
                req: 8,
                key: "ef".into(),
                dst: 9,
                len: 4096,
                notify: false,
                via: Via::IbDirect {
                    key: IbKey {
                        addr: 0x7f00_0000_1000,
                        len: 4096,
                        rkey: 0x1234,
                    },
                },
            },
            Frame::Response {
                req: 6,
                status: Status::NoDirect,
                text: "no dma-buf".into(),
                payload: 0,
            },
            Frame::Response {
                req: 7,
                status: Status::CmaDenied,
                text: "no".into(),
                payload: 0,
            },
        ] {
            let b = f.encode();
            assert_eq!(Frame::recv(&mut &b[..]).unwrap(), f);
            assert!(Frame::recv(&mut &b[..b.len() - 1]).is_err());
        }
    }
}
