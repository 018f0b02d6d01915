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
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

mod parse;

pub use parse::{parse_bool, parse_bytes, parse_duration};

include!(concat!(env!("OUT_DIR"), "/cvars_gen.rs"));

/// The type of a cvar, as declared in `cvars.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Kind {
    /// `1/true/yes/y` or `0/false/no/n`.
    Bool,
    /// A non-negative integer.
    Int,
    /// A floating-point number.
    Float,
    /// A byte count with an optional K/M/G (powers of 1024) suffix.
    Bytes,
    /// A duration: a bare number in the declared unit, or a number with ns/us/ms/s/m/h.
    Duration,
    /// Free text.
    String,
    /// One of the allowed values.
    Enum,
    /// A comma-separated list of allowed values.
    List,
    /// An IPv4 or IPv6 address.
    Ip,
    /// A socket address (`host:port`, IP only).
    Addr,
}

impl Kind {
    /// The name used in `cvars.toml` and the docs.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Bool => "bool",
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Bytes => "bytes",
            Kind::Duration => "duration",
            Kind::String => "string",
            Kind::Enum => "enum",
            Kind::List => "list",
            Kind::Ip => "ip",
            Kind::Addr => "addr",
        }
    }
}

/// Unit of a bare number given to a duration cvar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Seconds (fractions allowed).
    Seconds,
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
}

impl Unit {
    /// `s`, `ms` or `us`.
    pub fn suffix(self) -> &'static str {
        match self {
            Unit::Seconds => "s",
            Unit::Millis => "ms",
            Unit::Micros => "us",
        }
    }
}

/// The declaration of one cvar (one `[[cvar]]` of `cvars.toml`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    /// Environment variable, and key in the configuration file.
    pub name: &'static str,
    /// Type of the value.
    pub kind: Kind,
    /// Default, as a user would write it; `None`: unset by default.
    pub default: Option<&'static str>,
    /// Values of an enum, or items of a list.
    pub allowed: &'static [&'static str],
    /// Lower bound (as text of the same type).
    pub min: Option<&'static str>,
    /// The lower bound itself is not allowed.
    pub min_exclusive: bool,
    /// Upper bound (inclusive).
    pub max: Option<&'static str>,
    /// Unit of a bare number (durations).
    pub unit: Unit,
    /// One sentence.
    pub doc: &'static str,
    /// The crate that reads it.
    pub owner: &'static str,
}

impl Spec {
    /// The declaration of `name`.
    pub fn find(name: &str) -> Option<&'static Spec> {
        SPECS.iter().find(|s| s.name == name)
    }

    /// What a valid value looks like, for error messages and the docs.
    pub fn expected(&self) -> String {
        let bounds = |what: &str| {
            let mut s = what.to_string();
            if let Some(min) = self.min {
                s.push_str(if self.min_exclusive { " > " } else { " >= " });
                s.push_str(min);
            }
            if let Some(max) = self.max {
                s.push_str(if self.min.is_some() {
                    " and <= "
                } else {
                    " <= "
                });
                s.push_str(max);
            }
            s
        };
        match self.kind {
            Kind::Bool => "1/true/yes/y or 0/false/no/n".into(),
            Kind::Int => bounds("a non-negative integer"),
            Kind::Float => bounds("a number"),
            Kind::Bytes => format!("{} (e.g. 4096, 64K, 1M, 2G)", bounds("a byte count")),
            Kind::Duration => {
                let u = self.unit.suffix();
                format!(
                    "{} (a number of {u}, or with a unit: 500us, 20ms, 1.5s, 2m)",
                    bounds("a duration")
                )
            }
            Kind::String => "any text".into(),
            Kind::Enum => format!("one of {}", self.allowed.join(", ")),
            Kind::List => format!("a comma-separated list of {}", self.allowed.join(", ")),
            Kind::Ip => "an IP address such as 10.0.0.1 or fe80::1".into(),
            Kind::Addr => "an IP address and port such as 127.0.0.1:0 or [::1]:8080".into(),
        }
    }
}

/// Where the effective value of a cvar came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The default of `cvars.toml` (or unset).
    Default,
    /// The configuration file named by `TORCHCOMMS_CONFIG`.
    File(PathBuf),
    /// The environment variable.
    Env,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::File(p) => write!(f, "file {}", p.display()),
            Source::Env => f.write_str("environment"),
        }
    }
}

/// Errors of loading the configuration.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cvar has a value its type does not accept.
    #[error("invalid value {value:?} for {name} (from {origin}): expected {expected}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// The value given.
        value: String,
        /// Where it came from.
        origin: Source,
        /// What is allowed.
        expected: String,
    },
    /// The configuration file cannot be read or parsed.
    #[error("configuration file {} (TORCHCOMMS_CONFIG): {reason}", path.display())]
    ConfigFile {
        /// Its path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The configuration file names a variable that does not exist.
    #[error("configuration file {} (TORCHCOMMS_CONFIG): unknown variable `{key}`{}", path.display(), hint(suggestion))]
    UnknownKey {
        /// Its path.
        path: PathBuf,
        /// The key.
        key: String,
        /// The closest known name, if any is close.
        suggestion: Option<&'static str>,
    },
}

fn hint(s: &Option<&'static str>) -> String {
    match s {
        Some(s) => format!(" (did you mean {s}?)"),
        None => " (see docs/cvars.md for the list)".into(),
    }
}

impl Error {
    /// The variable the error is about (`TORCHCOMMS_CONFIG` for file errors).
    pub fn name(&self) -> &str {
        match self {
            Error::Invalid { name, .. } => name,
            _ => names::TORCHCOMMS_CONFIG,
        }
    }

    /// The offending value (the file's path for file errors).
    pub fn value(&self) -> String {
        match self {
            Error::Invalid { value, .. } => value.clone(),
            Error::ConfigFile { path, .. } => path.display().to_string(),
            Error::UnknownKey { key, .. } => key.clone(),
        }
    }

    /// What is allowed, in words.
    pub fn expected(&self) -> String {
        match self {
            Error::Invalid {
                expected, origin, ..
            } => format!("{expected} (value from {origin})"),
            Error::ConfigFile { reason, .. } => {
                format!("a readable TOML or YAML file of cvars ({reason})")
            }
            Error::UnknownKey { suggestion, .. } => {
                format!("only known variable names as keys{}", hint(suggestion))
            }
        }
    }
}

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

/// A Rust type a cvar can have.
trait CvarType: Sized {
    fn parse(spec: &'static Spec, text: &str) -> Option<Self>;
    fn show(&self) -> String;
    /// Checks `min`/`max` of the declaration.
    fn in_bounds(&self, _spec: &'static Spec) -> bool {
        true
    }
}

fn bounded<T: PartialOrd + CvarType>(v: &T, spec: &'static Spec) -> bool {
    let ok_min = match spec.min.and_then(|m| T::parse(spec, m)) {
        Some(min) if spec.min_exclusive => *v > min,
        Some(min) => *v >= min,
        None => true,
    };
    let ok_max = match spec.max.and_then(|m| T::parse(spec, m)) {
        Some(max) => *v <= max,
        None => true,
    };
    ok_min && ok_max
}

impl CvarType for bool {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        parse_bool(text)
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl CvarType for u64 {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        text.trim().replace('_', "").parse().ok()
    }
    fn show(&self) -> String {
        self.to_string()
    }
    fn in_bounds(&self, spec: &'static Spec) -> bool {
        bounded(self, spec)
    }
}

impl CvarType for f64 {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        text.trim().parse().ok().filter(|x: &f64| x.is_finite())
    }
    fn show(&self) -> String {
        self.to_string()
    }
    fn in_bounds(&self, spec: &'static Spec) -> bool {
        bounded(self, spec)
    }
}

impl CvarType for usize {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        parse_bytes(text).and_then(|b| usize::try_from(b).ok())
    }
    fn show(&self) -> String {
        parse::show_bytes(*self as u64)
    }
    fn in_bounds(&self, spec: &'static Spec) -> bool {
        bounded(self, spec)
    }
}

impl CvarType for Duration {
    fn parse(spec: &'static Spec, text: &str) -> Option<Self> {
        parse_duration(text, spec.unit)
    }
    fn show(&self) -> String {
        parse::show_duration(*self)
    }
    fn in_bounds(&self, spec: &'static Spec) -> bool {
        bounded(self, spec)
    }
}

impl CvarType for String {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        Some(text.to_string())
    }
    fn show(&self) -> String {
        self.clone()
    }
}

impl CvarType for &'static str {
    fn parse(spec: &'static Spec, text: &str) -> Option<Self> {
        let t = text.trim();
        spec.allowed
            .iter()
            .copied()
            .find(|a| a.eq_ignore_ascii_case(t))
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl CvarType for Vec<&'static str> {
    fn parse(spec: &'static Spec, text: &str) -> Option<Self> {
        let mut out: Vec<&'static str> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let a = <&'static str as CvarType>::parse(spec, item)?;
            if !out.contains(&a) {
                out.push(a);
            }
        }
        Some(out)
    }
    fn show(&self) -> String {
        self.join(",")
    }
}

impl CvarType for IpAddr {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        text.trim().parse().ok()
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

impl CvarType for SocketAddr {
    fn parse(_: &'static Spec, text: &str) -> Option<Self> {
        text.trim().parse().ok()
    }
    fn show(&self) -> String {
        self.to_string()
    }
}

/// Parses the text of `spec` from `source`; records its canonical form in `shown`.
fn parse_text<T: CvarType>(
    spec: &'static Spec,
    text: &str,
    source: Source,
    shown: &mut Vec<String>,
) -> Result<T, Error> {
    let invalid = || Error::Invalid {
        name: spec.name,
        value: text.to_string(),
        origin: source.clone(),
        expected: spec.expected(),
    };
    let v = T::parse(spec, text).ok_or_else(invalid)?;
    if !v.in_bounds(spec) {
        return Err(invalid());
    }
    shown.push(v.show());
    Ok(v)
}

/// A cvar with a default: the given text, else the default.
fn field<T: CvarType>(
    spec: &'static Spec,
    raw: &Option<Raw>,
    shown: &mut Vec<String>,
) -> Result<T, Error> {
    match raw {
        Some(r) => parse_text(spec, &r.text, r.source.clone(), shown),
        // build.rs only generates `field` for cvars with a default.
        None => parse_text(spec, spec.default.unwrap_or(""), Source::Default, shown),
    }
}

/// A cvar without a default: `None` unless given.
fn opt_field<T: CvarType>(
    spec: &'static Spec,
    raw: &Option<Raw>,
    shown: &mut Vec<String>,
) -> Result<Option<T>, Error> {
    match raw {
        Some(r) => parse_text(spec, &r.text, r.source.clone(), shown).map(Some),
        None => {
            shown.push(String::new());
            Ok(None)
        }
    }
}

/// The Levenshtein distance of two short strings (for "did you mean").
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn suggest(key: &str) -> Option<&'static str> {
    SPECS
        .iter()
        .map(|s| (distance(key, s.name), s.name))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, n)| n)
}

/// Reads the configuration file: variable name (upper case) -> text.
fn read_file(path: &Path) -> Result<BTreeMap<String, String>, Error> {
    let file_err = |reason: String| Error::ConfigFile {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_file() {
        return Err(file_err("no such file".into()));
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let format = match ext.as_str() {
        "toml" => config::FileFormat::Toml,
        "yaml" | "yml" => config::FileFormat::Yaml,
        _ => {
            return Err(file_err(format!(
                "unknown format `.{ext}`: name it *.toml, *.yaml or *.yml"
            )))
        }
    };
    let cfg = config::Config::builder()
        .add_source(config::File::from(path).format(format).required(true))
        .build()
        .map_err(|e| file_err(e.to_string()))?;
    let map = config::Source::collect(&cfg).map_err(|e| file_err(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (key, value) in map {
        let name = key.to_ascii_uppercase();
        let Some(spec) = Spec::find(&name) else {
            return Err(Error::UnknownKey {
                path: path.to_path_buf(),
                suggestion: suggest(&name),
                key,
            });
        };
        let text = match value.kind {
            config::ValueKind::Array(items) => {
                let mut parts = Vec::new();
                for v in items {
                    parts.push(
                        v.into_string()
                            .map_err(|e| file_err(format!("{}: {e}", spec.name)))?,
                    );
                }
                parts.join(",")
            }
            config::ValueKind::Table(_) => {
                return Err(file_err(format!(
                    "{}: expected a value, found a table",
                    spec.name
                )))
            }
            config::ValueKind::Nil => continue,
            kind => config::Value::new(None, kind)
                .into_string()
                .map_err(|e| file_err(format!("{}: {e}", spec.name)))?,
        };
        out.insert(spec.name.to_string(), text);
    }
    Ok(out)
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
            Some(p) => read_file(p)?,
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

/// The reference of every cvar as Markdown: what `docs/cvars.md` holds.
pub fn markdown() -> String {
    let mut s = String::from(
        "# Configuration variables (cvars)\n\n\
         <!-- Generated from cvars/cvars.toml by `CVARS_UPDATE_DOCS=1 cargo test -p torchcomms-cvars`. \
         Do not edit by hand. -->\n\n\
         Every tunable of torchcomms-rs, declared once in `cvars/cvars.toml`. Values come, lowest \
         precedence first, from the default below, the configuration file named by \
         `TORCHCOMMS_CONFIG` (TOML or YAML; keys are the variable names, lists may be arrays), \
         and the environment. An empty environment variable counts as unset. An invalid value \
         fails communicator creation with an error naming the variable, the value, where it \
         came from and what is allowed. `torchcomms-perf --print-cvars` prints the effective \
         value of each and its source.\n\n\
         Launcher variables (`TORCHCOMM_RANK`, `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, \
         `MASTER_PORT`, `OMPI_*`, `PMI_*`, `PALS_*`, `SLURM_*`, `TORCHELASTIC_USE_AGENT_STORE`) \
         describe the job rather than tune it and are read by the bootstrap layer directly.\n\n\
         Example `torchcomms.toml`:\n\n\
         ```toml\n\
         CTRAN_CHUNK_BYTES = \"4M\"\n\
         CTRAN_BACKENDS = [\"socket\", \"shm\"]\n\
         TORCHCOMMS_TRACE_DIR = \"/var/tmp/traces\"\n\
         TORCHCOMMS_TRACE_BUFFER_SIZE = 5000\n\
         ```\n\n\
         | Name | Type | Default | Allowed | Owner | Description |\n\
         | --- | --- | --- | --- | --- | --- |\n",
    );
    for spec in SPECS {
        let ty = match spec.kind {
            Kind::Duration => format!("duration ({})", spec.unit.suffix()),
            k => k.name().to_string(),
        };
        let default = match spec.default {
            Some("") => "(empty)".to_string(),
            Some(d) => format!("`{d}`"),
            None => "(unset)".to_string(),
        };
        let allowed = match spec.kind {
            Kind::String => String::new(),
            _ => spec.expected().replace('|', "\\|"),
        };
        s.push_str(&format!(
            "| `{}` | {ty} | {default} | {allowed} | {} | {} |\n",
            spec.name,
            spec.owner,
            spec.doc.replace('|', "\\|")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn defaults_parse_and_have_the_engine_values() {
        let cv = Cvars::defaults();
        assert_eq!(cv.ctran_chunk_bytes(), 1 << 20);
        assert_eq!(cv.torchcomm_timeout_seconds(), Duration::from_secs(600));
        assert_eq!(cv.ctran_backends(), &["socket", "shm", "nvl"]);
        assert_eq!(cv.ctran_socket_ifaddr(), None);
        assert_eq!(cv.ctran_socket_spin_us(), None);
        assert_eq!(cv.ctran_shm_spin_us(), None);
        assert_eq!(cv.ctran_allreduce_algo(), "auto");
        assert!(cv.torchcomm_abort_on_error());
        assert_eq!(cv.torchcomms_trace_buffer_size(), 2000);
        assert!(cv.entries().iter().all(|e| e.source == Source::Default));
        assert_eq!(cv.entries().len(), SPECS.len());
    }

    #[test]
    fn environment_values_are_typed_and_remember_their_source() {
        let cv = Cvars::load_from(env(&[
            ("CTRAN_CHUNK_BYTES", "2MiB"),
            ("TORCHCOMM_TIMEOUT_SECONDS", "1.5"),
            ("CTRAN_SOCKET_SPIN_US", "20ms"),
            ("CTRAN_BACKENDS", " SHM , socket,shm"),
            ("CTRAN_SOCKET_IFADDR", "10.1.2.3"),
            ("CTRAN_BROADCAST_ALGO", "Chain"),
            ("TORCHCOMM_ABORT_ON_ERROR", "n"),
            ("CTRAN_COST_ALPHA_US", "12.5"),
            ("TORCHCOMMS_TRACE_HTTP_ADDR", "[::1]:9000"),
            ("CTRAN_SHM_BUFFER_BYTES", ""),
        ]))
        .unwrap();
        assert_eq!(cv.ctran_chunk_bytes(), 2 << 20);
        assert_eq!(cv.torchcomm_timeout_seconds(), Duration::from_millis(1500));
        assert_eq!(cv.ctran_socket_spin_us(), Some(Duration::from_millis(20)));
        assert_eq!(cv.ctran_backends(), &["shm", "socket"]);
        assert_eq!(cv.ctran_socket_ifaddr(), Some("10.1.2.3".parse().unwrap()));
        assert_eq!(cv.ctran_broadcast_algo(), "chain");
        assert!(!cv.torchcomm_abort_on_error());
        assert_eq!(cv.ctran_cost_alpha_us(), Some(12.5));
        assert_eq!(cv.torchcomms_trace_http_addr().port(), 9000);
        let e = cv.entry("CTRAN_CHUNK_BYTES").unwrap();
        assert_eq!((e.value.as_str(), &e.source), ("2M", &Source::Env));
        // Empty counts as unset.
        assert_eq!(
            cv.entry("CTRAN_SHM_BUFFER_BYTES").unwrap().source,
            Source::Default
        );
        let t = cv.table();
        assert!(
            t.contains("CTRAN_SOCKET_IFADDR") && t.contains("10.1.2.3"),
            "{t}"
        );
        assert!(
            t.contains("CTRAN_COST_BETA_GBPS") && t.contains("(unset)"),
            "{t}"
        );
    }

    #[test]
    fn invalid_values_name_the_variable_the_value_and_what_is_allowed() {
        let cases: &[(&str, &str, &str)] = &[
            ("CTRAN_CHUNK_BYTES", "lots", ">= 4096"),
            ("CTRAN_CHUNK_BYTES", "100", ">= 4096"),
            ("TORCHCOMM_TIMEOUT_SECONDS", "0", "> 0"),
            ("TORCHCOMM_TIMEOUT_SECONDS", "-3", "duration"),
            ("TORCHCOMM_ABORT_ON_ERROR", "maybe", "1/true/yes/y"),
            ("CTRAN_BACKENDS", "socket,ib", "socket, shm"),
            ("CTRAN_ALLREDUCE_ALGO", "fastest", "ring, halving_doubling"),
            ("CTRAN_SOCKET_IFADDR", "eth0", "IP address"),
            ("CTRAN_COST_BETA_GBPS", "0", "> 0"),
            ("CTRAN_COST_BETA_GBPS", "inf", "number"),
            ("TORCHCOMMS_TRACE_BUFFER_SIZE", "-1", "non-negative integer"),
            ("TORCHCOMMS_TRACE_BUFFER_SIZE", "99999999999", "<= 10000000"),
            ("TORCHCOMMS_TRACE_HTTP_ADDR", "localhost", "port"),
            ("TORCHCOMMS_TRACE_DUMP_ON", "always", "timeout, error"),
        ];
        for &(name, value, allowed) in cases {
            let lookup = move |k: &str| (k == name).then(|| value.to_string());
            let err = Cvars::load_from(lookup).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(name) && msg.contains(value) && msg.contains(allowed),
                "{name}={value}: {msg}"
            );
            assert!(msg.contains("environment"), "{msg}");
            assert_eq!(err.name(), name);
            assert_eq!(err.value(), value);
        }
    }

    #[test]
    fn every_default_is_valid_and_every_spec_is_documented() {
        for s in SPECS {
            assert!(!s.doc.is_empty() && s.doc.ends_with('.'), "{}", s.name);
            assert!(s
                .name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit()));
        }
        let md = markdown();
        for s in SPECS {
            assert!(md.contains(&format!("`{}`", s.name)));
        }
    }

    #[test]
    fn suggestions_for_typos() {
        assert_eq!(suggest("CTRAN_CHUNK_BYTE"), Some("CTRAN_CHUNK_BYTES"));
        assert_eq!(suggest("SOMETHING_ELSE_ENTIRELY"), None);
    }
}
