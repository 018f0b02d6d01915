//! Any `torch.distributed.Store` (TCPStore, PrefixStore, FileStore, HashStore, or a Python
//! subclass) as the engine's [`Store`]: every call attaches to the interpreter and calls the
//! store's Python method. torch's store methods release the GIL while they block, so a rank
//! waiting on the store does not stall the process's other Python threads.

use std::fmt;
use std::net::{IpAddr, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use torchcomms_core::bootstrap::Store;

/// A Python store object behind the engine's store trait.
pub(crate) struct PyStore {
    obj: Py<PyAny>,
    what: String,
}

impl fmt::Debug for PyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PyStore({})", self.what)
    }
}

impl PyStore {
    /// Wraps `obj`, which must have the methods of `torch.distributed.Store`.
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> PyResult<PyStore> {
        for m in ["set", "get", "add", "check", "wait"] {
            if !obj.hasattr(m)? {
                return Err(crate::error::type_error(format!(
                    "new_comm: argument `store` must be a torch.distributed.Store, got {} \
                     (it has no `{m}` method)",
                    obj.get_type().name()?
                )));
            }
        }
        Ok(PyStore {
            obj: obj.clone().unbind(),
            what: obj.get_type().name()?.to_string(),
        })
    }

    fn call<T>(
        &self,
        op: &'static str,
        key: &str,
        f: impl FnOnce(&Bound<'_, PyAny>) -> PyResult<T>,
    ) -> torchcomms_core::Result<T> {
        Python::attach(|py| f(self.obj.bind(py))).map_err(|e| torchcomms_core::Error::Store {
            op,
            key: key.to_string(),
            reason: format!("{} raised {e}", self.what),
        })
    }
}

/// The address this host uses to reach `host` (no packet is sent: a UDP connect only picks a
/// route).
fn route_to(host: &str, port: u16) -> Option<IpAddr> {
    let addr = (host, port).to_socket_addrs().ok()?.next()?;
    let any: IpAddr = if addr.is_ipv4() {
        [0, 0, 0, 0].into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let s = UdpSocket::bind((any, 0)).ok()?;
    s.connect(addr).ok()?;
    Some(s.local_addr().ok()?.ip())
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> torchcomms_core::Result<()> {
        self.call("set", key, |s| {
            s.call_method1("set", (key, PyBytes::new(s.py(), value)))?;
            Ok(())
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> torchcomms_core::Result<Vec<u8>> {
        self.call("get", key, |s| {
            s.call_method1("wait", (vec![key], timeout))?;
            s.call_method1("get", (key,))?.extract::<Vec<u8>>()
        })
    }

    fn add(&self, key: &str, delta: i64) -> torchcomms_core::Result<i64> {
        self.call("add", key, |s| {
            s.call_method1("add", (key, delta))?.extract()
        })
    }

    fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> torchcomms_core::Result<Vec<u8>> {
        self.call("compare_set", key, |s| {
            let py = s.py();
            s.call_method1(
                "compare_set",
                (key, PyBytes::new(py, expected), PyBytes::new(py, desired)),
            )?
            .extract::<Vec<u8>>()
        })
    }

    fn delete(&self, key: &str) -> torchcomms_core::Result<bool> {
        self.call("delete", key, |s| {
            s.call_method1("delete_key", (key,))?.extract()
        })
    }

    fn check(&self, keys: &[&str]) -> torchcomms_core::Result<bool> {
        let first = keys.first().copied().unwrap_or_default();
        self.call("check", first, |s| {
            s.call_method1("check", (keys.to_vec(),))?.extract()
        })
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> torchcomms_core::Result<()> {
        let first = keys.first().copied().unwrap_or_default();
        self.call("wait", first, |s| {
            s.call_method1("wait", (keys.to_vec(), timeout))?;
            Ok(())
        })
    }

    fn local_addr_hint(&self) -> Option<IpAddr> {
        // A TCPStore (possibly under PrefixStores) names the host all ranks reach: advertise
        // the local address on the route to it.
        Python::attach(|py| {
            let mut s = self.obj.bind(py).clone();
            for _ in 0..16 {
                if let (Ok(host), Ok(port)) = (s.getattr("host"), s.getattr("port")) {
                    let host: String = host.extract().ok()?;
                    let port: u16 = port.extract().ok()?;
                    return route_to(&host, port);
                }
                s = s.getattr("underlying_store").ok()?;
            }
            None
        })
    }
}
