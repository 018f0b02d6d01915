//! Errors of loading the configuration, and where a value came from.

use std::fmt;
use std::path::PathBuf;

use crate::names;

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
