//! A key-value store speaking the wire protocol of `torch.distributed.TCPStore`, both ways:
//! [`TcpStoreClient`] works against a store served by PyTorch (libuv or legacy server), and
//! [`TcpStoreServer`] serves PyTorch clients (`TCPStore(host, port, is_master=False)`).
//!
//! That lets a job launched by torchrun reuse torchrun's agent store, and lets a Rust rank 0
//! host the store for Python ranks. [`TcpStore`] is the usual "rank 0 serves, everybody
//! connects" pairing.
//!
//! ```
//! use std::time::Duration;
//! use torchcomms_core::bootstrap::tcp_store::{TcpStoreClient, TcpStoreServer};
//! use torchcomms_core::bootstrap::Store;
//!
//! let server = TcpStoreServer::bind("127.0.0.1", 0)?;
//! let client = TcpStoreClient::connect("127.0.0.1", server.port(), Duration::from_secs(5))?;
//! client.set("greeting", b"hello")?;
//! assert_eq!(client.get("greeting", Duration::from_secs(1))?, b"hello");
//! assert_eq!(client.add("counter", 2)?, 2);
//! # Ok::<(), torchcomms_core::Error>(())
//! ```
//!
//! Protocol notes (from torch's `TCPStore.cpp`, `TCPStoreBackend.cpp`,
//! `TCPStoreLibUvBackend.cpp`, checked against torch 2.15 on the wire): the table of commands is in
//! `tcp_store/protocol.rs`.
//! Every connection starts with `VALIDATE` + magic and a `PING`; torch's client prefixes user
//! keys with `/`; `get` is a server-side `WAIT` then `GET`; a wait that times out is withdrawn
//! with `CANCEL_WAIT`, whose reply may be preceded by a late `STOP_WAITING`.

mod client;
mod decode;
pub(crate) mod protocol;
mod server;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

pub use client::TcpStoreClient;
pub use server::{StoreLimits, TcpStoreServer};

/// Entry points for the fuzz targets (`fuzz/`): the decoders of both ends of the protocol.
/// Not an API: present only with the `fuzzing` feature.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzz {
    pub use super::client::fuzz::replies as client_replies;
    pub use super::server::fuzz::{requests as server_requests, sample_session};
}

use crate::bootstrap::Store;
use crate::error::Result;

/// A connection to a TCP store, plus the server itself when this process hosts it.
///
/// Dropping it closes the connection (once no other `Arc` of the client is left) and stops the
/// server, freeing the port for the next store.
#[derive(Debug)]
#[must_use = "dropping a TcpStore stops its server"]
pub struct TcpStore {
    client: Arc<TcpStoreClient>,
    server: Option<TcpStoreServer>,
}

impl TcpStore {
    /// With `is_server`, binds every interface on `port` (0 = ephemeral) and serves; then, in
    /// every case, connects to `host:port` (the bound port when serving), retrying until
    /// `timeout`. The server connects through `host` rather than loopback so that
    /// [`local_addr_hint`](Store::local_addr_hint) is an address peers can reach.
    pub fn serve_or_connect(
        host: &str,
        port: u16,
        is_server: bool,
        timeout: Duration,
    ) -> Result<Self> {
        let server = if is_server {
            Some(TcpStoreServer::bind("", port)?)
        } else {
            None
        };
        let port = server.as_ref().map_or(port, TcpStoreServer::port);
        let client = Arc::new(TcpStoreClient::connect(host, port, timeout)?);
        Ok(TcpStore { client, server })
    }

    /// The client connection.
    pub fn client(&self) -> &Arc<TcpStoreClient> {
        &self.client
    }

    /// The server, when this process hosts it.
    pub fn server(&self) -> Option<&TcpStoreServer> {
        self.server.as_ref()
    }

    /// The port of the store.
    pub fn port(&self) -> u16 {
        self.client.port()
    }

    /// Splits into the client and the (optional) server, e.g. to share the client as an
    /// `Arc<dyn Store>` while the owner keeps the server alive.
    pub fn into_parts(self) -> (Arc<TcpStoreClient>, Option<TcpStoreServer>) {
        (self.client, self.server)
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.client.set(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.client.get(key, timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.client.add(key, delta)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        self.client.compare_set(key, expected, desired)
    }

    fn delete(&self, key: &str) -> Result<bool> {
        self.client.delete(key)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.client.check(keys)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.client.wait(keys, timeout)
    }

    fn local_addr_hint(&self) -> Option<IpAddr> {
        self.client.local_addr_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::Barrier;
    use std::thread;
    use std::time::Instant;

    use super::*;
    use crate::Error;

    const T: Duration = Duration::from_secs(10);

    fn pair() -> (TcpStoreServer, TcpStoreClient) {
        let server = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
        let client = TcpStoreClient::connect("127.0.0.1", server.port(), T).unwrap();
        (server, client)
    }

    #[test]
    fn every_store_op_against_our_server() {
        let (_server, c) = pair();
        c.ping().unwrap();
        c.set("a", b"1").unwrap();
        assert_eq!(c.get("a", T).unwrap(), b"1");
        c.set("a", b"").unwrap();
        assert_eq!(c.get("a", T).unwrap(), b"", "empty values are values");
        assert_eq!(c.add("n", 5).unwrap(), 5);
        assert_eq!(c.add("n", -7).unwrap(), -2);
        assert_eq!(
            c.get("n", T).unwrap(),
            b"-2",
            "counters are decimal text, as in torch"
        );

        // compare_set: missing + empty expected creates; mismatch leaves the value.
        assert_eq!(c.compare_set("cas", b"", b"x").unwrap(), b"x");
        assert_eq!(c.compare_set("cas", b"nope", b"y").unwrap(), b"x");
        assert_eq!(c.compare_set("cas", b"x", b"y").unwrap(), b"y");
        assert_eq!(
            c.compare_set("missing", b"e", b"d").unwrap(),
            b"e",
            "torch's reply"
        );
        assert!(!c.check(&["missing"]).unwrap());

        assert!(c.check(&["a", "n", "cas"]).unwrap());
        assert!(!c.check(&["a", "zzz"]).unwrap());
        c.wait(&["a", "n"], T).unwrap();
        assert!(c.delete("a").unwrap());
        assert!(!c.delete("a").unwrap());
        assert!(!c.check(&["a"]).unwrap());

        assert_eq!(c.num_keys().unwrap(), 2);
        let mut keys = c.list_keys().unwrap();
        keys.sort();
        assert_eq!(keys, vec!["cas", "n"]);
        c.append("ap", b"ab").unwrap();
        c.append("ap", b"cd").unwrap();
        c.multi_set(&[("m1", b"x"), ("m2", b"yy")]).unwrap();
        assert_eq!(
            c.multi_get(&["ap", "m1", "m2"]).unwrap(),
            vec![b"abcd".to_vec(), b"x".to_vec(), b"yy".to_vec()]
        );

        assert_eq!(c.queue_len("q").unwrap(), 0);
        assert_eq!(c.queue_pop("q", false, T).unwrap(), None);
        c.queue_push("q", b"first").unwrap();
        c.queue_push("q", b"second").unwrap();
        assert_eq!(c.queue_len("q").unwrap(), 2);
        assert_eq!(c.queue_pop("q", true, T).unwrap().unwrap(), b"first");
        assert_eq!(c.queue_pop("q", false, T).unwrap().unwrap(), b"second");
        c.barrier("solo", 1, T).unwrap();

        let big = vec![7u8; 3 << 20];
        c.set("big", &big).unwrap();
        assert_eq!(c.get("big", T).unwrap(), big);
        assert!(c.local_addr_hint().unwrap().is_loopback());
    }

    #[test]
    fn concurrent_waiters_are_released_by_one_set() {
        let (server, setter) = pair();
        let port = server.port();
        let n = 6;
        let ready = Arc::new(Barrier::new(n + 1));
        let waiters: Vec<_> = (0..n)
            .map(|i| {
                let ready = ready.clone();
                thread::spawn(move || {
                    let c = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
                    ready.wait();
                    if i % 2 == 0 {
                        c.wait(&["go", "also"], T).unwrap();
                        Vec::new()
                    } else {
                        c.get("go", T).unwrap()
                    }
                })
            })
            .collect();
        ready.wait();
        thread::sleep(Duration::from_millis(100));
        setter.set("go", b"now").unwrap();
        setter.add("also", 1).unwrap();
        for (i, w) in waiters.into_iter().enumerate() {
            let got = w.join().unwrap();
            if i % 2 == 1 {
                assert_eq!(got, b"now");
            }
        }
    }

    #[test]
    fn one_client_shared_by_threads_does_not_block_on_a_waiter() {
        let (_server, c) = pair();
        let c = Arc::new(c);
        let waiter = {
            let c = c.clone();
            thread::spawn(move || c.get("late", T))
        };
        thread::sleep(Duration::from_millis(100));
        // The waiter holds one connection; this set goes over another.
        c.set("late", b"v").unwrap();
        assert_eq!(waiter.join().unwrap().unwrap(), b"v");
    }

    #[test]
    fn timeouts_are_errors_and_leave_the_connection_usable() {
        let (_server, c) = pair();
        let start = Instant::now();
        let err = c.wait(&["never"], Duration::from_millis(200)).unwrap_err();
        assert!(start.elapsed() < Duration::from_secs(5));
        match &err {
            Error::Store { op, key, reason } => {
                assert_eq!(*op, "wait");
                assert_eq!(key, "never");
                assert!(reason.contains("timed out"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(c.get("never", Duration::ZERO).is_err());
        // The cancelled waits must not leave stray replies on the (reused) connection.
        c.set("after", b"ok").unwrap();
        assert_eq!(c.get("after", T).unwrap(), b"ok");
        assert_eq!(c.add("cnt", 1).unwrap(), 1);
        assert!(c.check(&["after"]).unwrap());
    }

    #[test]
    fn connect_retries_until_the_server_appears() {
        let probe = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
        let port = probe.port();
        probe.shutdown().unwrap();
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(300));
            TcpStoreServer::bind("127.0.0.1", port).unwrap()
        });
        let c = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
        c.set("k", b"v").unwrap();
        drop(late.join().unwrap());
    }

    #[test]
    fn connect_gives_up_at_its_deadline() {
        let probe = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
        let port = probe.port();
        drop(probe);
        let start = Instant::now();
        let err = TcpStoreClient::connect("127.0.0.1", port, Duration::from_millis(300));
        assert!(
            matches!(err, Err(Error::Store { op: "connect", .. })),
            "{err:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn shutdown_frees_the_port_for_an_immediate_rebind() {
        let (server, c) = pair();
        let port = server.port();
        c.set("x", b"1").unwrap();
        drop(server);
        // The old connection is now dead: ops fail with the op and key named, no hang.
        let err = c
            .set("y", b"2")
            .and_then(|_| c.get("y", Duration::from_secs(2)));
        match err {
            Err(Error::Store { op, key, .. }) => {
                assert!(op == "set" || op == "get", "{op}");
                assert_eq!(key, "y");
            }
            other => panic!("expected a store error, got {other:?}"),
        }
        for _ in 0..3 {
            let again = TcpStoreServer::bind("127.0.0.1", port).unwrap();
            let c2 = TcpStoreClient::connect("127.0.0.1", port, T).unwrap();
            assert!(!c2.check(&["x"]).unwrap(), "a new server starts empty");
            again.shutdown().unwrap();
        }
    }

    #[test]
    fn a_second_server_on_a_busy_port_is_an_error() {
        let server = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
        let err = TcpStoreServer::bind("127.0.0.1", server.port()).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
    }

    #[test]
    fn clients_that_do_not_validate_are_dropped() {
        let (server, c) = pair();
        let mut rogue = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
        rogue.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        rogue.set_read_timeout(Some(T)).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(
            rogue.read(&mut buf).unwrap_or(0),
            0,
            "server must close the connection"
        );
        c.set("still", b"fine").unwrap();
        assert_eq!(c.get("still", T).unwrap(), b"fine");
    }

    /// A connection to the server on `port` that has sent VALIDATE, reads timing out after `T`.
    pub(super) fn raw_client(port: u16) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        s.write_all(
            &protocol::Request::Validate {
                magic: protocol::VALIDATION_MAGIC,
            }
            .encode(),
        )
        .unwrap();
        s
    }

    #[test]
    fn a_client_that_does_not_read_cannot_stall_the_server() {
        let (server, c) = pair();
        let value = vec![0x5au8; 1 << 20];
        c.set("big", &value).unwrap();
        // 100 MiB of replies, unread for now: past the high-water mark the server stops
        // decoding this client's requests but keeps serving everyone else.
        let mut greedy = raw_client(server.port());
        let get = protocol::Request::Get {
            key: b"/big".to_vec(),
        }
        .encode();
        let n = 100;
        greedy.write_all(&get.repeat(n)).unwrap();
        thread::sleep(Duration::from_millis(200));
        let start = Instant::now();
        for i in 0..20 {
            c.set(&format!("k{i}"), b"v").unwrap();
            assert_eq!(c.get(&format!("k{i}"), T).unwrap(), b"v");
        }
        assert!(start.elapsed() < Duration::from_secs(5));
        // Reading now lets the server finish the backlog: every reply arrives intact.
        let mut reply = vec![0u8; 8 + value.len()];
        for _ in 0..n {
            greedy.read_exact(&mut reply).unwrap();
            assert_eq!(
                u64::from_le_bytes(reply[..8].try_into().unwrap()),
                value.len() as u64
            );
            assert!(reply[8..] == value[..]);
        }
    }

    #[test]
    fn a_half_closed_client_still_gets_its_replies() {
        let (server, _c) = pair();
        let mut s = raw_client(server.port());
        s.write_all(&protocol::Request::Ping { nonce: 77 }.encode())
            .unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut nonce = [0u8; 4];
        s.read_exact(&mut nonce).unwrap();
        assert_eq!(u32::from_le_bytes(nonce), 77);
        assert_eq!(s.read(&mut nonce).unwrap(), 0, "then the server closes");
    }

    #[test]
    fn serve_or_connect_pairs_a_server_and_clients() {
        let rank0 = TcpStore::serve_or_connect("127.0.0.1", 0, true, T).unwrap();
        let port = rank0.port();
        assert!(rank0.server().is_some());
        let rank1 = TcpStore::serve_or_connect("127.0.0.1", port, false, T).unwrap();
        rank1.set("hello", b"from 1").unwrap();
        assert_eq!(rank0.get("hello", T).unwrap(), b"from 1");
        drop(rank1);
        drop(rank0);
        // The port is free again.
        TcpStoreServer::bind("", port).unwrap();
    }
}
