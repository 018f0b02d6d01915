//! Which address a listening socket binds to (`TORCHCOMMS_BIND_ADDR`).
//!
//! torch's store listens on every interface. Anything that can route to the port can then
//! reach it, so by default we bind only the interface that reaches `MASTER_ADDR`: a job whose
//! `MASTER_ADDR` is `127.0.0.1` is not reachable from the network at all.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs, UdpSocket};

use crate::error::{Error, Result};

/// The cvar choosing the bind address.
pub const BIND_ADDR_VAR: &str = "TORCHCOMMS_BIND_ADDR";

/// Where listeners bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindAddr {
    /// The interface that reaches the address peers use (the default).
    Auto,
    /// Every interface, as torch does.
    All,
    /// This address.
    Ip(IpAddr),
}

impl BindAddr {
    /// Parses the cvar's text.
    pub fn parse(text: &str) -> Result<BindAddr> {
        match text.trim() {
            "" | "auto" => Ok(BindAddr::Auto),
            "all" | "*" => Ok(BindAddr::All),
            other => other
                .parse()
                .map(BindAddr::Ip)
                .map_err(|_| Error::invalid(BIND_ADDR_VAR, "auto, all or an IP address", other)),
        }
    }

    /// The configured value (`TORCHCOMMS_BIND_ADDR`).
    pub fn from_cvars() -> Result<BindAddr> {
        let cv = torchcomms_cvars::reload()
            .map_err(|e| Error::invalid(BIND_ADDR_VAR, "a valid configuration", e))?;
        BindAddr::parse(cv.torchcomms_bind_addr())
    }

    /// The address to bind for a listener that peers reach at `toward` (their view of this
    /// host, or `MASTER_ADDR`); `None` means every interface.
    pub fn resolve(self, toward: IpAddr) -> Option<IpAddr> {
        match self {
            BindAddr::All => None,
            BindAddr::Ip(ip) => Some(ip),
            BindAddr::Auto if toward.is_unspecified() => None,
            BindAddr::Auto => Some(route_to(toward).unwrap_or(toward)),
        }
    }
}

/// The launcher's `MASTER_ADDR` resolved to an IPv4 address (an input, not a tunable; see
/// `bootstrap::rendezvous`), when it is set and resolves.
pub fn master_addr_ipv4() -> Option<IpAddr> {
    let host = std::env::var("MASTER_ADDR").ok()?;
    (host.as_str(), 0)
        .to_socket_addrs()
        .ok()?
        .map(|a| a.ip())
        .find(|ip| ip.is_ipv4())
}

/// The local address this host uses to reach `ip` (a UDP socket "connected" to it sends
/// nothing); `ip` itself when it is loopback or one of this host's addresses.
pub fn route_to(ip: IpAddr) -> Option<IpAddr> {
    if ip.is_loopback() {
        return Some(ip);
    }
    let any = if ip.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let probe = UdpSocket::bind(SocketAddr::new(any, 0)).ok()?;
    probe.connect(SocketAddr::new(ip, 9)).ok()?;
    probe.local_addr().ok().map(|a| a.ip())
}

/// The host string a store server for `master_host` binds (`""`: every interface).
pub fn store_bind_host(master_host: &str, bind: BindAddr) -> String {
    if bind == BindAddr::All {
        return String::new();
    }
    if let BindAddr::Ip(ip) = bind {
        return ip.to_string();
    }
    let resolved = (master_host, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| a.ip());
    match resolved.and_then(|ip| bind.resolve(ip)) {
        Some(ip) => ip.to_string(),
        // Unresolvable here: every interface, and the client's connect reports the name.
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_master_binds_loopback_only() {
        assert_eq!(store_bind_host("127.0.0.1", BindAddr::Auto), "127.0.0.1");
        assert_eq!(store_bind_host("127.0.0.1", BindAddr::All), "");
        assert_eq!(BindAddr::parse("all").unwrap(), BindAddr::All);
        assert_eq!(BindAddr::parse("").unwrap(), BindAddr::Auto);
        let e = BindAddr::parse("nowhere").unwrap_err().to_string();
        assert!(e.contains(BIND_ADDR_VAR), "{e}");
    }
}
