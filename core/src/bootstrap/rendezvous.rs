//! Rendezvous through `MASTER_ADDR` / `MASTER_PORT`, the way torch's `env://` init does.
//!
//! Without torchrun's agent store, rank 0 serves a [`TcpStoreServer`] on `MASTER_PORT` and
//! every rank (rank 0 included) connects to `MASTER_ADDR:MASTER_PORT`. Under torchrun with
//! `TORCHELASTIC_USE_AGENT_STORE=True` the agent already serves a store there, so every rank,
//! rank 0 too, is only a client. The agent's store also carries torchrun's own keys (and those
//! of torch's default process group): callers add keys under their own prefix
//! ([`PrefixStore`](super::PrefixStore)) and never delete keys they did not create.

use std::sync::Arc;
use std::time::Duration;

use super::bind::{store_bind_host, BindAddr};
use super::tcp_store::{TcpStoreClient, TcpStoreServer};
use super::Store;
use crate::error::{Error, Result};

/// Host of the store (`MASTER_ADDR`).
pub const MASTER_ADDR_VAR: &str = "MASTER_ADDR";
/// Port of the store (`MASTER_PORT`).
pub const MASTER_PORT_VAR: &str = "MASTER_PORT";
/// Set to `True`/`1` by torchrun when its agent serves the store on `MASTER_PORT`.
pub const USE_AGENT_STORE_VAR: &str = "TORCHELASTIC_USE_AGENT_STORE";

/// The store a communicator bootstraps through, and the server when this rank hosts it.
///
/// Dropping it stops the server (rank 0 without an agent store) and drops this handle's
/// connection, so the next communicator can bootstrap on the same `MASTER_PORT` right away.
/// Clones of [`store`](Self::store) keep their connection, which fails once the server is gone.
#[derive(Debug)]
#[must_use = "dropping the BootstrapStore stops the store server on rank 0"]
pub struct BootstrapStore {
    store: Arc<dyn Store>,
    server: Option<TcpStoreServer>,
    host: String,
    port: u16,
    agent_store: bool,
}

impl BootstrapStore {
    /// The store, shareable with communicators.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// True when this process serves the store.
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    /// True when the store is torchrun's agent store.
    pub fn is_agent_store(&self) -> bool {
        self.agent_store
    }

    /// `MASTER_ADDR`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// `MASTER_PORT`.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// Builds the bootstrap store from `MASTER_ADDR`, `MASTER_PORT` and
/// `TORCHELASTIC_USE_AGENT_STORE`. Clients retry connecting until `timeout` (rank 0 may start
/// its server after the others start connecting); `timeout` is also the deadline of later store
/// calls that do not take one.
pub fn store_from_env(rank: usize, size: usize, timeout: Duration) -> Result<BootstrapStore> {
    // Set by the launcher (torchrun's MASTER_ADDR/MASTER_PORT and TORCHELASTIC_*): inputs, not
    // tunables, so read directly and not declared as cvars.
    store_from_lookup(|name| std::env::var(name).ok(), rank, size, timeout)
}

/// A client of torchrun's agent store when the environment names one
/// (`TORCHELASTIC_USE_AGENT_STORE` true, with `MASTER_ADDR`/`MASTER_PORT`): a store that
/// outlives every worker, which reconfigurable communicators need. `None` when it does not.
pub fn agent_store_from_env(timeout: Duration) -> Result<Option<TcpStoreClient>> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let agent = var(USE_AGENT_STORE_VAR)
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"));
    let (true, Some(host), Some(port)) = (agent, var(MASTER_ADDR_VAR), var(MASTER_PORT_VAR)) else {
        return Ok(None);
    };
    let port = match port.trim().parse::<u16>() {
        Ok(p) if p != 0 => p,
        _ => {
            return Err(Error::invalid(
                MASTER_PORT_VAR,
                "a TCP port in 1..=65535",
                port,
            ))
        }
    };
    Ok(Some(TcpStoreClient::connect(host.trim(), port, timeout)?))
}

/// [`store_from_env`] over any variable lookup (tests, or configuration that is not in the
/// process environment).
pub fn store_from_lookup(
    lookup: impl Fn(&str) -> Option<String>,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> Result<BootstrapStore> {
    if size == 0 || rank >= size {
        return Err(Error::invalid(
            "rank",
            format!("a rank below size {size}"),
            rank,
        ));
    }
    let host = match lookup(MASTER_ADDR_VAR) {
        Some(h) if !h.trim().is_empty() => h.trim().to_owned(),
        other => {
            return Err(Error::invalid(
                MASTER_ADDR_VAR,
                "the host name or address of rank 0 (or of torchrun's agent store)",
                format!("{other:?}"),
            ))
        }
    };
    let port = match lookup(MASTER_PORT_VAR) {
        Some(p) => match p.trim().parse::<u16>() {
            Ok(port) if port != 0 => port,
            _ => {
                return Err(Error::invalid(
                    MASTER_PORT_VAR,
                    "a TCP port in 1..=65535",
                    p,
                ))
            }
        },
        None => {
            return Err(Error::invalid(
                MASTER_PORT_VAR,
                "a TCP port in 1..=65535",
                "unset",
            ));
        }
    };
    let agent_store = match lookup(USE_AGENT_STORE_VAR) {
        None => false,
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" => true,
            "" | "0" | "false" | "no" => false,
            _ => return Err(Error::invalid(USE_AGENT_STORE_VAR, "True/False or 1/0", v)),
        },
    };

    let server = if rank == 0 && !agent_store {
        // Only the interface that reaches MASTER_ADDR (loopback for a loopback MASTER_ADDR),
        // unless TORCHCOMMS_BIND_ADDR says otherwise: torch listens on every interface.
        let bind_host = store_bind_host(&host, BindAddr::from_cvars()?);
        Some(
            TcpStoreServer::bind(&bind_host, port).map_err(|e| Error::Bootstrap {
                comm: String::new(),
                reason: format!("rank 0 cannot serve the store on {MASTER_PORT_VAR}={port}: {e}"),
            })?,
        )
    } else {
        None
    };
    // Rank 0 also connects through MASTER_ADDR (not loopback) so that its store's
    // `local_addr_hint` is an address the other hosts can reach.
    let client = TcpStoreClient::connect(&host, port, timeout)?;
    tracing::debug!(rank, size, %host, port, agent_store, serving = server.is_some(),
        "bootstrap store ready");
    Ok(BootstrapStore {
        store: Arc::new(client),
        server,
        host,
        port,
        agent_store,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::thread;

    use super::*;

    const T: Duration = Duration::from_secs(10);

    fn env(pairs: &[(&str, String)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn free_port() -> u16 {
        let s = TcpStoreServer::bind("", 0).unwrap();
        s.port()
    }

    fn invalid_arg(r: Result<BootstrapStore>) -> String {
        match r {
            Err(Error::InvalidArgument { arg, .. }) => arg,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn missing_or_bad_variables_are_named() {
        let short = Duration::from_millis(100);
        assert_eq!(
            invalid_arg(store_from_lookup(env(&[]), 0, 2, short)),
            MASTER_ADDR_VAR
        );
        let addr = (MASTER_ADDR_VAR, "127.0.0.1".to_string());
        assert_eq!(
            invalid_arg(store_from_lookup(
                env(std::slice::from_ref(&addr)),
                0,
                2,
                short
            )),
            MASTER_PORT_VAR
        );
        for bad in ["", "http", "70000", "0", "-5"] {
            let e = env(&[addr.clone(), (MASTER_PORT_VAR, bad.to_string())]);
            assert_eq!(
                invalid_arg(store_from_lookup(e, 0, 2, short)),
                MASTER_PORT_VAR,
                "{bad}"
            );
        }
        let e = env(&[
            addr.clone(),
            (MASTER_PORT_VAR, "29500".into()),
            (USE_AGENT_STORE_VAR, "perhaps".into()),
        ]);
        assert_eq!(
            invalid_arg(store_from_lookup(e, 0, 2, short)),
            USE_AGENT_STORE_VAR
        );
        let e = env(&[addr, (MASTER_PORT_VAR, "29500".into())]);
        assert_eq!(invalid_arg(store_from_lookup(e, 2, 2, short)), "rank");
    }

    #[test]
    fn rank0_serves_and_others_connect_then_the_port_is_reusable() {
        let port = free_port();
        let vars = [
            (MASTER_ADDR_VAR, "127.0.0.1".to_string()),
            (MASTER_PORT_VAR, port.to_string()),
        ];
        for round in 0..2 {
            // Non-zero ranks start first: they must retry until rank 0 serves.
            let others: Vec<_> = (1..3)
                .map(|rank| {
                    let vars = vars.clone();
                    thread::spawn(move || {
                        let b = store_from_lookup(env(&vars), rank, 3, T).unwrap();
                        assert!(!b.is_server());
                        b.store()
                            .set(&format!("r{round}/rank{rank}"), b"here")
                            .unwrap();
                        b.store().wait(&[&format!("r{round}/done")], T).unwrap();
                    })
                })
                .collect();
            thread::sleep(Duration::from_millis(150));
            let b0 = store_from_lookup(env(&vars), 0, 3, T).unwrap();
            assert!(b0.is_server() && !b0.is_agent_store());
            assert_eq!(b0.port(), port);
            let s = b0.store();
            s.wait(&[&format!("r{round}/rank1"), &format!("r{round}/rank2")], T)
                .unwrap();
            assert!(
                !s.check(&["r0/rank1"]).unwrap() || round == 0,
                "a fresh server per round"
            );
            s.set(&format!("r{round}/done"), b"").unwrap();
            for o in others {
                o.join().unwrap();
            }
            drop(b0);
        }
    }

    #[test]
    fn agent_store_makes_rank0_a_client() {
        let agent = TcpStoreServer::bind("127.0.0.1", 0).unwrap();
        let vars = [
            (MASTER_ADDR_VAR, "127.0.0.1".to_string()),
            (MASTER_PORT_VAR, agent.port().to_string()),
            (USE_AGENT_STORE_VAR, "True".to_string()),
        ];
        let b0 = store_from_lookup(env(&vars), 0, 2, T).unwrap();
        let b1 = store_from_lookup(env(&vars), 1, 2, T).unwrap();
        assert!(!b0.is_server() && b0.is_agent_store());
        b1.store().set("k", b"v").unwrap();
        assert_eq!(b0.store().get("k", T).unwrap(), b"v");
        drop((b0, b1));
        // The agent's store outlives the ranks' handles.
        let c = TcpStoreClient::connect("127.0.0.1", agent.port(), T).unwrap();
        assert!(c.check(&["k"]).unwrap());
    }

    #[test]
    fn a_client_without_a_server_times_out() {
        let port = free_port();
        let vars = [
            (MASTER_ADDR_VAR, "127.0.0.1".to_string()),
            (MASTER_PORT_VAR, port.to_string()),
        ];
        let err = store_from_lookup(env(&vars), 1, 2, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, Error::Store { op: "connect", .. }), "{err:?}");
    }
}
