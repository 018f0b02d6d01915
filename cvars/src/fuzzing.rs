//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not an API): the value
//! parsers through the environment, and the configuration file's parser.

use std::collections::HashMap;
use std::path::Path;

use crate::{names, Cvars, SPECS};

/// Lines of `<selector byte><value>`: the selector picks the variable (every declared one is
/// reachable), the value is what the environment holds. Every value is parsed and checked as
/// at start-up, and the table printed.
pub fn env(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut env: HashMap<&str, String> = HashMap::new();
    for line in text.lines() {
        let Some(&sel) = line.as_bytes().first() else {
            continue;
        };
        let spec = &SPECS[usize::from(sel) % SPECS.len()];
        // The file is the other target's business: never read a file named by the input.
        if spec.name != names::TORCHCOMMS_CONFIG {
            env.insert(spec.name, line.get(1..).unwrap_or("").to_owned());
        }
    }
    if let Ok(cv) = Cvars::load_from(|k| env.get(k).cloned()) {
        let _ = cv.table();
    }
}

/// A configuration file: first byte even for TOML, odd for YAML, then the file's text.
pub fn config_file(data: &[u8]) {
    let Some((&sel, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let format = if sel % 2 == 0 {
        config::FileFormat::Toml
    } else {
        config::FileFormat::Yaml
    };
    let _ = crate::file::parse_text(text, format, Path::new("fuzz.toml"));
}
