//! The declaration of a cvar: its name, type, default, bounds and doc.

use crate::SPECS;

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
