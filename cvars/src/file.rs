//! The configuration file named by `TORCHCOMMS_CONFIG` (TOML or YAML, read with `config`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Error, Spec, SPECS};

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

pub(crate) fn suggest(key: &str) -> Option<&'static str> {
    SPECS
        .iter()
        .map(|s| (distance(key, s.name), s.name))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, n)| n)
}

/// Reads the configuration file: variable name (upper case) -> text.
pub(crate) fn read_file(path: &Path) -> Result<BTreeMap<String, String>, Error> {
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
    let text = std::fs::read_to_string(path).map_err(|e| file_err(e.to_string()))?;
    parse_text(&text, format, path)
}

/// Parses the text of a configuration file in `format`; `path` is for messages only. Apart
/// from [`read_file`] so that it can be fuzzed without files.
pub(crate) fn parse_text(
    text: &str,
    format: config::FileFormat,
    path: &Path,
) -> Result<BTreeMap<String, String>, Error> {
    let file_err = |reason: String| Error::ConfigFile {
        path: path.to_path_buf(),
        reason,
    };
    let cfg = config::Config::builder()
        .add_source(config::File::from_str(text, format))
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
