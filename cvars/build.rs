//! Generates the typed accessors of every cvar from `cvars.toml` (see that file for its fields).

use std::fmt::Write as _;
use std::path::PathBuf;

const TYPES: &[(&str, &str, &str)] = &[
    // (type in cvars.toml, Rust type, Kind variant)
    ("bool", "bool", "Bool"),
    ("int", "u64", "Int"),
    ("float", "f64", "Float"),
    ("bytes", "usize", "Bytes"),
    ("duration", "::std::time::Duration", "Duration"),
    ("string", "String", "String"),
    ("enum", "&'static str", "Enum"),
    ("list", "Vec<&'static str>", "List"),
    ("ip", "::std::net::IpAddr", "Ip"),
    ("addr", "::std::net::SocketAddr", "Addr"),
];

fn fail(msg: String) -> ! {
    panic!("cvars.toml: {msg}");
}

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let path = dir.join("cvars.toml");
    println!("cargo:rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| fail(format!("{e}")));
    let doc: toml::Table = text.parse().unwrap_or_else(|e| fail(format!("{e}")));
    let cvars = doc
        .get("cvar")
        .and_then(|v| v.as_array())
        .unwrap_or_else(|| fail("no [[cvar]] entries".into()));

    let mut specs = String::new();
    let mut fields = String::new();
    let mut parse = String::new();
    let mut methods = String::new();
    let mut free = String::new();
    let mut names = String::new();
    let mut seen = Vec::new();
    for (i, c) in cvars.iter().enumerate() {
        let t = c
            .as_table()
            .unwrap_or_else(|| fail(format!("entry {i} is not a table")));
        let s = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let name = s("name").unwrap_or_else(|| fail(format!("entry {i} has no name")));
        for k in t.keys() {
            if ![
                "name",
                "type",
                "default",
                "allowed",
                "min",
                "max",
                "min_exclusive",
                "unit",
                "doc",
                "owner",
            ]
            .contains(&k.as_str())
            {
                fail(format!("{name}: unknown field `{k}`"));
            }
        }
        if seen.contains(&name) {
            fail(format!("{name} is declared twice"));
        }
        seen.push(name.clone());
        let ty = s("type").unwrap_or_else(|| fail(format!("{name} has no type")));
        let &(_, rust, kind) = TYPES
            .iter()
            .find(|(n, _, _)| *n == ty)
            .unwrap_or_else(|| fail(format!("{name}: unknown type `{ty}`")));
        let doc = s("doc").unwrap_or_else(|| fail(format!("{name} has no doc")));
        let owner = s("owner").unwrap_or_else(|| fail(format!("{name} has no owner")));
        let default = s("default");
        let allowed: Vec<String> = t
            .get("allowed")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if matches!(ty.as_str(), "enum" | "list") && allowed.is_empty() {
            fail(format!("{name}: an {ty} needs `allowed`"));
        }
        let unit = s("unit");
        if ty == "duration" && !matches!(unit.as_deref(), Some("s" | "ms" | "us")) {
            fail(format!("{name}: a duration needs unit = s, ms or us"));
        }
        let min_exclusive = t
            .get("min_exclusive")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let opt = |v: &Option<String>| match v {
            Some(v) => format!("Some({v:?})"),
            None => "None".into(),
        };
        let unit_expr = match unit.as_deref() {
            Some("s") => "Unit::Seconds",
            Some("ms") => "Unit::Millis",
            Some("us") => "Unit::Micros",
            _ => "Unit::Seconds",
        };
        writeln!(
            specs,
            "    Spec {{ name: {name:?}, kind: Kind::{kind}, default: {}, allowed: &{allowed:?}, \
             min: {}, min_exclusive: {min_exclusive}, max: {}, unit: {unit_expr}, doc: {doc:?}, \
             owner: {owner:?} }},",
            opt(&default),
            opt(&s("min")),
            opt(&s("max")),
        )
        .unwrap();
        let field = name.to_ascii_lowercase();
        let full = if default.is_some() {
            rust.to_string()
        } else {
            format!("Option<{rust}>")
        };
        writeln!(fields, "    /// {doc}\n    pub {field}: {full},").unwrap();
        let parser = if default.is_some() {
            "field"
        } else {
            "opt_field"
        };
        writeln!(
            parse,
            "            {field}: {parser}(&SPECS[{i}], &raw[{i}], shown)?,"
        )
        .unwrap();
        let (ret, body, fret, fbody) = match (ty.as_str(), default.is_some()) {
            ("string", true) => (
                "&str",
                format!("&self.values.{field}"),
                "String".to_string(),
                format!("current().values.{field}.clone()"),
            ),
            ("string", false) => (
                "Option<&str>",
                format!("self.values.{field}.as_deref()"),
                "Option<String>".into(),
                format!("current().values.{field}.clone()"),
            ),
            ("list", true) => (
                "&[&'static str]",
                format!("&self.values.{field}"),
                full.clone(),
                format!("current().values.{field}.clone()"),
            ),
            ("list", false) => (
                "Option<&[&'static str]>",
                format!("self.values.{field}.as_deref()"),
                full.clone(),
                format!("current().values.{field}.clone()"),
            ),
            _ => (
                full.as_str(),
                format!("self.values.{field}"),
                full.clone(),
                format!("current().values.{field}"),
            ),
        };
        let d = match &default {
            Some(d) => format!("Default `{d}`."),
            None => "Unset by default.".into(),
        };
        writeln!(
            methods,
            "    /// `{name}`: {doc} {d}\n    pub fn {field}(&self) -> {ret} {{\n        {body}\n    }}"
        )
        .unwrap();
        writeln!(
            free,
            "/// `{name}` of the current configuration ([`current`]): {doc} {d}\npub fn {field}() -> {fret} {{\n    {fbody}\n}}"
        )
        .unwrap();
        writeln!(
            names,
            "    /// `{name}`.\n    pub const {name}: &str = {name:?};"
        )
        .unwrap();
    }

    let out = format!(
        "// @generated by build.rs from cvars.toml. Do not edit.\n\n\
         /// Declarations of every cvar, in the order of `cvars.toml`.\n\
         pub static SPECS: &[Spec] = &[\n{specs}];\n\n\
         /// The names of every cvar, as constants (for error messages and lookups).\n\
         pub mod names {{\n{names}}}\n\n\
         /// The typed value of every cvar.\n\
         #[derive(Debug, Clone, PartialEq)]\n\
         pub struct Values {{\n{fields}}}\n\n\
         impl Values {{\n\
         \x20   /// Parses the effective text of every cvar (`None`: unset), in [`SPECS`] order; \
         `shown` gets the canonical text of each value.\n\
         \x20   fn parse(raw: &[Option<Raw>], shown: &mut Vec<String>) -> Result<Values, Error> {{\n\
         \x20       Ok(Values {{\n{parse}        }})\n    }}\n}}\n\n\
         impl Cvars {{\n{methods}}}\n\n{free}"
    );
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("cvars_gen.rs");
    std::fs::write(dest, out).expect("write cvars_gen.rs");
}
