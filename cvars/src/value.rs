//! Parsing the text of a cvar into its Rust type, and checking its bounds.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::parse::{self, parse_bool, parse_bytes, parse_duration};
use crate::{Error, Raw, Source, Spec};

/// A Rust type a cvar can have.
pub(crate) trait CvarType: Sized {
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
pub(crate) fn field<T: CvarType>(
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
pub(crate) fn opt_field<T: CvarType>(
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
