//! Whether a process owns the other end of a TCP connection on this host: what a target checks
//! before it trusts the pid a request names for cross-memory attach. Without the check, a peer
//! could name a third process and have the target (with its privileges) copy that process's
//! memory into, or out of, a registration the peer can reach.
//!
//! The kernel knows: the peer's socket is the `/proc/net/tcp{,6}` row whose local address is
//! this connection's remote one and whose remote address is its local one; the process owns it
//! when one of `/proc/<pid>/fd/*` links to `socket:[<that row's inode>]`.

use std::net::{SocketAddr, TcpStream};

/// How `/proc/net/tcp{,6}` prints `addr`: the address as 32-bit words in host order, then the
/// port, all upper-case hex.
fn proc_hex(addr: &SocketAddr) -> String {
    let words = |octets: &[u8]| -> String {
        octets
            .chunks(4)
            .map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
            .collect()
    };
    let ip = match addr {
        SocketAddr::V4(a) => words(&a.ip().octets()),
        SocketAddr::V6(a) => words(&a.ip().octets()),
    };
    format!("{ip}:{:04X}", addr.port())
}

/// The inode of the socket whose local address is `local` and remote address `remote`.
fn socket_inode(local: &SocketAddr, remote: &SocketAddr) -> Option<u64> {
    let table = match local {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let (want_local, want_remote) = (proc_hex(local), proc_hex(remote));
    let text = std::fs::read_to_string(table).ok()?;
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f.len() > 9 && f[1] == want_local && f[2] == want_remote)
            .then(|| f[9].parse().ok())
            .flatten()
    })
}

/// Whether process `pid` holds the peer's end of `stream`.
pub(crate) fn owns_peer_end(stream: &TcpStream, pid: u32) -> bool {
    let (Ok(here), Ok(there)) = (stream.local_addr(), stream.peer_addr()) else {
        return false;
    };
    let Some(inode) = socket_inode(&there, &here) else {
        return false;
    };
    let want = format!("socket:[{inode}]");
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.filter_map(|e| e.ok()).any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str().to_string_lossy() == want)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn addresses_print_as_proc_does() {
        let a: SocketAddr = "127.0.0.1:8080".parse().expect("addr");
        assert_eq!(proc_hex(&a), "0100007F:1F90");
    }

    #[test]
    fn this_process_owns_its_own_connection_and_pid_1_does_not() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (server, _) = l.accept().expect("accept");
        assert!(owns_peer_end(&server, std::process::id()));
        assert!(owns_peer_end(&client, std::process::id()));
        if std::process::id() != 1 {
            assert!(!owns_peer_end(&server, 1), "another process");
        }
    }
}
