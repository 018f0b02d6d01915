//! The URL `bind()` returns and the peer passes to `connect()`, and the hello that opens a
//! connection.
//!
//! The URL carries a random 128-bit token: only someone given the URL out of band can open a
//! connection (the hello names the listener's token), and the listener accepts only the peer
//! whose own URL it was given (the hello names the dialer's token too).

use std::fmt;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};

use super::error::{RdmaError, Result};
use super::key::{hex, unhex};

const SCHEME: &str = "tcrdma1://";
const MAGIC: &[u8; 8] = b"TCRDMA01";
/// Bytes of a hello: magic, the dialer's token, the listener's token.
pub(crate) const HELLO_BYTES: usize = 8 + 16 + 16;
/// The listener's answer to a hello it accepted.
pub(crate) const ACK: u8 = 0xA5;

/// What `bind()` hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerUrl {
    /// Where the listener is reachable.
    pub addr: SocketAddr,
    /// The listener's secret token.
    pub token: [u8; 16],
    /// The binder's host identity ([`super::key::host_id`]).
    pub host: u64,
    /// The binder's pid.
    pub pid: u32,
    /// The binder's ib data path endpoint (`TORCHCOMMS_RDMA_PATH=ib`).
    pub ib: Option<Vec<u8>>,
}

impl fmt::Display for PeerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}{}/{}/{:016x}/{}",
            self.addr,
            hex(&self.token),
            self.host,
            self.pid
        )?;
        match &self.ib {
            Some(ep) => write!(f, "/ib={}", hex(ep)),
            None => Ok(()),
        }
    }
}

impl PeerUrl {
    /// Parses the text `Display` writes.
    pub fn parse(text: &str) -> Result<PeerUrl> {
        let bad = |why: &str| {
            RdmaError::MalformedUrl(format!(
                "{why}; expected {SCHEME}<ip>:<port>/<32 hex token>/<16 hex host>/<pid>[/ib=<hex>], \
                 got {text:?}"
            ))
        };
        let rest = text
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("wrong scheme"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let (addr, token, host, pid, ib) = match parts[..] {
            [a, t, h, p] => (a, t, h, p, None),
            [a, t, h, p, ib] => {
                let ep = ib
                    .strip_prefix("ib=")
                    .and_then(unhex)
                    .ok_or_else(|| bad("bad ib endpoint"))?;
                (a, t, h, p, Some(ep))
            }
            _ => return Err(bad("wrong number of parts")),
        };
        let addr: SocketAddr = addr.parse().map_err(|_| bad("bad address"))?;
        let token: [u8; 16] = unhex(token)
            .and_then(|t| t.try_into().ok())
            .ok_or_else(|| bad("bad token"))?;
        let host = u64::from_str_radix(host, 16).map_err(|_| bad("bad host"))?;
        let pid = pid.parse().map_err(|_| bad("bad pid"))?;
        Ok(PeerUrl {
            addr,
            token,
            host,
            pid,
            ib,
        })
    }
}

/// The address a listener binds and advertises: `TORCHCOMMS_BIND_ADDR` when it names one,
/// else the interface that reaches `MASTER_ADDR` (as the bootstrap picks), else the interface
/// of the default route (reachable from other hosts and network namespaces), else loopback.
pub(crate) fn listen_ip() -> Result<IpAddr> {
    use torchcomms_core::bootstrap::bind::{route_to, BindAddr};
    let bind = BindAddr::from_cvars().map_err(|e| RdmaError::Config(e.to_string()))?;
    if let BindAddr::Ip(ip) = bind {
        return Ok(ip);
    }
    let master = torchcomms_core::bootstrap::bind::master_addr_ipv4();
    if let Some(ip) = master.and_then(route_to) {
        return Ok(ip);
    }
    // A UDP "connect" sends nothing: it only asks the kernel which interface routes there.
    let public = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    Ok(route_to(public)
        .filter(|ip| !ip.is_unspecified())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)))
}

/// The hello a dialer sends: its own token and the listener's.
pub(crate) fn hello(from: &[u8; 16], to: &[u8; 16]) -> [u8; HELLO_BYTES] {
    let mut h = [0u8; HELLO_BYTES];
    h[..8].copy_from_slice(MAGIC);
    h[8..24].copy_from_slice(from);
    h[24..].copy_from_slice(to);
    h
}

/// Reads a hello: (dialer's token, listener's token), or why it is not one.
pub(crate) fn read_hello(s: &mut TcpStream) -> std::io::Result<([u8; 16], [u8; 16])> {
    let mut h = [0u8; HELLO_BYTES];
    s.read_exact(&mut h)?;
    if &h[..8] != MAGIC {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not an RdmaTransport hello",
        ));
    }
    let mut from = [0u8; 16];
    let mut to = [0u8; 16];
    from.copy_from_slice(&h[8..24]);
    to.copy_from_slice(&h[24..]);
    Ok((from, to))
}

/// Sends the one-byte acknowledgement.
pub(crate) fn send_ack(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(&[ACK])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_round_trips() {
        let u = PeerUrl {
            addr: "10.1.2.3:4567".parse().unwrap(),
            token: [7; 16],
            host: 0xdead_beef,
            pid: 42,
            ib: None,
        };
        assert_eq!(PeerUrl::parse(&u.to_string()).unwrap(), u);
        let with_ib = PeerUrl {
            ib: Some(vec![1, 2, 0xff]),
            ..u.clone()
        };
        assert!(with_ib.to_string().ends_with("/ib=0102ff"));
        assert_eq!(PeerUrl::parse(&with_ib.to_string()).unwrap(), with_ib);
        let v6 = PeerUrl {
            addr: "[::1]:80".parse().unwrap(),
            ..u
        };
        assert_eq!(PeerUrl::parse(&v6.to_string()).unwrap(), v6);
        let no_ib = "tcrdma1://1.2.3.4:5/00000000000000000000000000000000/0/1/xb=00";
        for bad in ["", "http://x", "tcrdma1://1.2.3.4:5/zz/0/1", no_ib] {
            assert!(matches!(
                PeerUrl::parse(bad),
                Err(RdmaError::MalformedUrl(_))
            ));
        }
    }
}
