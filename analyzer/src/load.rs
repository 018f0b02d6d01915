//! Reading dumps: from a directory of files, or from live endpoints (a list, or found in the
//! store).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use colltrace::schema::{parse_dumps, SchemaError};
use colltrace::Dump;

/// A source that yielded nothing usable, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// File path or endpoint address.
    pub source: String,
    /// What went wrong.
    pub reason: String,
}

/// Errors of loading that leave nothing to analyze.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The directory cannot be listed.
    #[error("cannot read directory {}: {source}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The store cannot be reached or holds no endpoints.
    #[error("store {addr}: {reason}")]
    Store {
        /// `host:port`.
        addr: String,
        /// Why.
        reason: String,
    },
}

/// Every dump in `dir` (files `*.json`); files that cannot be read are returned as problems.
pub fn read_dir(dir: &Path) -> Result<(Vec<Dump>, Vec<Problem>), Error> {
    let entries = std::fs::read_dir(dir).map_err(|source| Error::Dir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    paths.sort();
    let mut dumps = Vec::new();
    let mut problems = Vec::new();
    for p in paths {
        match std::fs::read(&p) {
            Ok(bytes) => match parse_dumps(&bytes) {
                Ok(d) => dumps.extend(d),
                Err(e) => problems.push(Problem {
                    source: p.display().to_string(),
                    reason: e.to_string(),
                }),
            },
            Err(e) => problems.push(Problem {
                source: p.display().to_string(),
                reason: e.to_string(),
            }),
        }
    }
    Ok((dumps, problems))
}

/// `GET http://addr/path` with a deadline; returns the body of a 200 answer. A minimal HTTP/1.0
/// client: the endpoints are our own colltrace servers (loopback or the cluster network), so
/// no TLS, redirects or chunking are needed.
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    let sa: SocketAddr = addr
        .to_socket_addrs()
        .map_err(|e| format!("bad address: {e}"))?
        .next()
        .ok_or("address resolves to nothing")?;
    let mut s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).ok();
    s.set_write_timeout(Some(timeout)).ok();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .map_err(|e| format!("receive: {e}"))?;
    http_body(&buf).map(<[u8]>::to_vec)
}

/// The body of an HTTP answer whose status is 200 (the rest of what [`http_get`] does, apart
/// so that it can be fuzzed).
pub fn http_body(answer: &[u8]) -> Result<&[u8], String> {
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("malformed HTTP answer")?;
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head.lines().next().unwrap_or("");
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("answered `{status}`"));
    }
    Ok(&answer[end + 4..])
}

/// Polls every endpoint once.
pub fn poll(endpoints: &[String], timeout: Duration) -> (Vec<Dump>, Vec<Problem>) {
    let mut dumps = Vec::new();
    let mut problems = Vec::new();
    for ep in endpoints {
        let res = http_get(ep, "/colltrace", timeout)
            .and_then(|b| parse_dumps(&b).map_err(|e: SchemaError| e.to_string()));
        match res {
            Ok(d) => dumps.extend(d),
            Err(reason) => problems.push(Problem {
                source: format!("http://{ep}/colltrace"),
                reason,
            }),
        }
    }
    (dumps, problems)
}

/// Store key of the number of published endpoints (see `ctran`'s communicator creation).
pub const COUNT_KEY: &str = "torchcomms/colltrace/count";

/// Store key of the `i`-th published endpoint (0-based): `<global rank> <comm> <host:port>`.
pub fn endpoint_key(i: i64) -> String {
    format!("torchcomms/colltrace/endpoint/{i}")
}

/// The live endpoints published in the store at `addr` (`host:port` of a TCPStore), without
/// duplicates.
pub fn endpoints_from_store(addr: &str, timeout: Duration) -> Result<Vec<String>, Error> {
    use torchcomms_core::bootstrap::Store;
    let err = |reason: String| Error::Store {
        addr: addr.to_string(),
        reason,
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| err("expected host:port".into()))?;
    let port: u16 = port.parse().map_err(|_| err("bad port".into()))?;
    let store = torchcomms_core::bootstrap::tcp_store::TcpStoreClient::connect(host, port, timeout)
        .map_err(|e| err(e.to_string()))?;
    let n = store.add(COUNT_KEY, 0).map_err(|e| err(e.to_string()))?;
    let mut out: Vec<String> = Vec::new();
    for i in 0..n {
        let v = store
            .get(&endpoint_key(i), timeout)
            .map_err(|e| err(e.to_string()))?;
        let text = String::from_utf8_lossy(&v).into_owned();
        if let Some(ep) = text.split_whitespace().last() {
            if !out.iter().any(|o| o == ep) {
                out.push(ep.to_string());
            }
        }
    }
    Ok(out)
}
