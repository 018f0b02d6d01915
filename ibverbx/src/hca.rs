//! Device selection in NCCL_IB_HCA's syntax (`CTRAN_IB_HCA`).
//!
//! `[^][=]name[:port][,name[:port]...]`: a leading `^` excludes the listed devices instead of
//! selecting them, a leading `=` (after `^` if both) makes names match exactly instead of as
//! prefixes, and `:port` restricts an entry to one port. `mlx5` selects `mlx5_0`, `mlx5_1`...;
//! `=mlx5_1` only `mlx5_1`; `^=mlx5_1:2` everything but port 2 of `mlx5_1`. An empty list
//! selects everything.

use std::fmt;

use crate::error::{Error, Result};

/// One entry of a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HcaEntry {
    /// Device name or prefix.
    pub name: String,
    /// Port, when restricted to one.
    pub port: Option<u8>,
}

/// A parsed HCA list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HcaSpec {
    /// `^`: the entries are excluded.
    pub exclude: bool,
    /// `=`: names match exactly.
    pub exact: bool,
    /// The entries.
    pub entries: Vec<HcaEntry>,
}

impl HcaSpec {
    /// Every device and port.
    pub fn all() -> HcaSpec {
        HcaSpec::default()
    }

    /// Parses the syntax above.
    pub fn parse(text: &str) -> Result<HcaSpec> {
        let bad = |reason: String| Error::BadHcaSpec {
            spec: text.to_string(),
            reason,
        };
        let mut s = text.trim();
        let mut spec = HcaSpec::default();
        if let Some(rest) = s.strip_prefix('^') {
            spec.exclude = true;
            s = rest.trim_start();
        }
        if let Some(rest) = s.strip_prefix('=') {
            spec.exact = true;
            s = rest.trim_start();
        }
        if s.is_empty() {
            if spec.exclude || spec.exact {
                return Err(bad("a prefix with no device".into()));
            }
            return Ok(spec);
        }
        for item in s.split(',') {
            let item = item.trim();
            if item.is_empty() {
                return Err(bad("an empty entry".into()));
            }
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let port: u8 = p
                        .trim()
                        .parse()
                        .map_err(|_| bad(format!("port {p:?} of {n:?} is not a number 1..=255")))?;
                    if port == 0 {
                        return Err(bad(format!("port 0 of {n:?}: ports count from 1")));
                    }
                    (n.trim(), Some(port))
                }
                None => (item, None),
            };
            if name.is_empty() || name.contains(['^', '=']) || name.contains(char::is_whitespace) {
                return Err(bad(format!("device name {name:?}")));
            }
            spec.entries.push(HcaEntry {
                name: name.to_string(),
                port,
            });
        }
        Ok(spec)
    }

    fn listed(&self, device: &str, port: u8) -> bool {
        self.entries.iter().any(|e| {
            let name_ok = if self.exact {
                e.name == device
            } else {
                device.starts_with(&e.name)
            };
            name_ok && e.port.is_none_or(|p| p == port)
        })
    }

    /// Whether port `port` of `device` is selected.
    pub fn matches(&self, device: &str, port: u8) -> bool {
        if self.entries.is_empty() {
            return true;
        }
        self.listed(device, port) != self.exclude
    }
}

impl std::str::FromStr for HcaSpec {
    type Err = Error;
    fn from_str(s: &str) -> Result<HcaSpec> {
        HcaSpec::parse(s)
    }
}

impl fmt::Display for HcaSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exclude {
            f.write_str("^")?;
        }
        if self.exact {
            f.write_str("=")?;
        }
        for (i, e) in self.entries.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&e.name)?;
            if let Some(p) = e.port {
                write!(f, ":{p}")?;
            }
        }
        Ok(())
    }
}
