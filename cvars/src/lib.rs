//! # torchcomms-cvars
//!
//! Every tunable of torchcomms-rs, declared once in `cvars/cvars.toml` (name, type, default,
//! allowed values, a sentence of doc, the crate that reads it). The build script turns that file
//! into typed accessors, and `docs/cvars.md` is generated from it as well (a test fails when
//! the committed copy is stale; `CVARS_UPDATE_DOCS=1 cargo test -p torchcomms-cvars` rewrites
//! it).
//!
//! Values come, lowest precedence first, from the declared defaults, then the optional
//! configuration file named by `TORCHCOMMS_CONFIG` (TOML or YAML, read with the `config`
//! crate; keys are the variable names), then the environment. Every value remembers where it
//! came from ([`Source`]). An invalid value is an [`Error`] naming the variable, the value, its
//! source and what is allowed.
//!
//! ```
//! use torchcomms_cvars::{Cvars, Source};
//!
//! // A configuration from an explicit environment (the process environment: `Cvars::load()`).
//! let env = |k: &str| (k == "CTRAN_CHUNK_BYTES").then(|| "64K".to_string());
//! let cv = Cvars::load_from(env).unwrap();
//! assert_eq!(cv.ctran_chunk_bytes(), 64 << 10);
//! assert_eq!(cv.entry("CTRAN_CHUNK_BYTES").unwrap().source, Source::Env);
//! assert_eq!(cv.torchcomm_timeout_seconds().as_secs(), 600);
//!
//! let bad = |k: &str| (k == "CTRAN_CHUNK_BYTES").then(|| "lots".to_string());
//! let err = Cvars::load_from(bad).unwrap_err().to_string();
//! assert!(err.contains("CTRAN_CHUNK_BYTES") && err.contains("lots"), "{err}");
//! ```
//!
//! Communicator creation calls [`reload`], so a changed environment applies to the next
//! communicator; the free functions (`torchcomms_cvars::ctran_chunk_bytes()`) read the
//! configuration installed last ([`current`]). Thread safety: everything here is `Send + Sync`;
//! loading reads the environment, which the caller must not modify concurrently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

mod error;
mod file;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod markdown;
mod parse;
mod spec;
#[cfg(test)]
mod tests;
mod value;

pub use error::{Error, Source};
pub use markdown::markdown;
pub use parse::{parse_bool, parse_bytes, parse_duration};
pub use spec::{Kind, Spec, Unit};
use value::{field, opt_field};

include!(concat!(env!("OUT_DIR"), "/cvars_gen.rs"));

/// Effective text of a cvar and where it came from.
#[derive(Debug, Clone, PartialEq)]
struct Raw {
    text: String,
    source: Source,
}

/// One cvar of a loaded configuration, for listings.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Its declaration.
    pub spec: &'static Spec,
    /// The effective value in canonical form (`""` when unset).
    pub value: String,
    /// Whether it is set (a default or a given value).
    pub is_set: bool,
    /// Where the value came from.
    pub source: Source,
}

/// A loaded configuration: the typed value of every cvar and where each came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Cvars {
    /// The typed values (also reachable through the accessor methods).
    pub values: Values,
    entries: Vec<Entry>,
    file: Option<PathBuf>,
}

impl Cvars {
    /// Loads the configuration from the defaults, the `TORCHCOMMS_CONFIG` file and the process
    /// environment.
    pub fn load() -> Result<Cvars, Error> {
        Cvars::load_from(|k| std::env::var(k).ok())
    }

    /// [`Cvars::load`] with `env` in place of the process environment (tests, embedders).
    pub fn load_from(env: impl Fn(&str) -> Option<String>) -> Result<Cvars, Error> {
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let file = env(names::TORCHCOMMS_CONFIG).map(PathBuf::from);
        let from_file = match &file {
            Some(p) => file::read_file(p)?,
            None => BTreeMap::new(),
        };
        let raw: Vec<Option<Raw>> = SPECS
            .iter()
            .map(|s| {
                if let Some(text) = env(s.name) {
                    return Some(Raw {
                        text,
                        source: Source::Env,
                    });
                }
                from_file.get(s.name).map(|text| Raw {
                    text: text.clone(),
                    source: Source::File(file.clone().unwrap_or_default()),
                })
            })
            .collect();
        let mut shown = Vec::with_capacity(SPECS.len());
        let values = Values::parse(&raw, &mut shown)?;
        let entries = SPECS
            .iter()
            .zip(raw)
            .zip(shown)
            .map(|((spec, raw), value)| Entry {
                spec,
                is_set: raw.is_some() || spec.default.is_some(),
                value,
                source: raw.map_or(Source::Default, |r| r.source),
            })
            .collect();
        Ok(Cvars {
            values,
            entries,
            file,
        })
    }

    /// Every declared default, nothing read from file or environment.
    pub fn defaults() -> Cvars {
        Cvars::load_from(|_| None).unwrap_or_else(|e| {
            // The build checks nothing about defaults; this test-covered path keeps it total.
            panic!("a default in cvars.toml is invalid: {e}")
        })
    }

    /// Every cvar, in declaration order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The cvar `name`.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.spec.name == name)
    }

    /// The configuration file that was read, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// A table of every cvar with its effective value and source (`torchcomms-perf
    /// --print-cvars`).
    pub fn table(&self) -> String {
        let w = self
            .entries
            .iter()
            .map(|e| e.spec.name.len())
            .max()
            .unwrap_or(0);
        let v = self
            .entries
            .iter()
            .map(|e| e.value.len().max(7))
            .max()
            .unwrap_or(0)
            .min(40);
        let mut s = format!("{:<w$}  {:<v$}  SOURCE\n", "NAME", "VALUE");
        for e in &self.entries {
            let value = if e.is_set {
                e.value.as_str()
            } else {
                "(unset)"
            };
            s.push_str(&format!(
                "{:<w$}  {:<v$}  {}\n",
                e.spec.name, value, e.source
            ));
        }
        s
    }
}

static CURRENT: RwLock<Option<Arc<Cvars>>> = RwLock::new(None);

/// Loads the configuration ([`Cvars::load`]) and installs it as the current one; on error the
/// current one stays.
pub fn reload() -> Result<Arc<Cvars>, Error> {
    let cv = Arc::new(Cvars::load()?);
    *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::clone(&cv));
    Ok(cv)
}

/// The configuration installed last by [`reload`]; the first call loads one. If the environment
/// holds an invalid value and nothing was installed yet, the defaults are used (the error
/// surfaces where a communicator is created, which calls [`reload`]).
pub fn current() -> Arc<Cvars> {
    if let Some(cv) = CURRENT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        return Arc::clone(cv);
    }
    match reload() {
        Ok(cv) => cv,
        Err(e) => {
            tracing::warn!("cvars: {e}; using the defaults until it is fixed");
            Arc::new(Cvars::defaults())
        }
    }
}
