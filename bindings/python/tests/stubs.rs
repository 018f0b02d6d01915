//! The parts of `_comms.pyi` that describe the table of operations (`OpName` members, the
//! pre-hook records, the `TorchComm` methods) are generated from it
//! (`torchcomms_core::ops::OPS`), so they cannot drift from what the module defines. Regenerate
//! them with `TORCHCOMMS_BLESS=1 cargo test -p torchcomms-python --test stubs`.

use std::path::PathBuf;

use torchcomms_core::ops::{ArgKind, OpSpec, OPS};

fn stub_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python/torchcomms/_comms.pyi")
}

const BEGIN: &str = "# BEGIN GENERATED";
const END: &str = "# END GENERATED";

/// The Python type of an argument of `kind` in a method signature and in a hook record.
fn py_type(kind: ArgKind, in_record: bool) -> &'static str {
    match (kind, in_record) {
        (ArgKind::Tensor, _) => "torch.Tensor",
        (ArgKind::Tensors, false) => "Sequence[torch.Tensor]",
        (ArgKind::Tensors, true) => "list[torch.Tensor]",
        (ArgKind::Rank, _) => "int",
        (ArgKind::ReduceOp, _) => "ReduceOp",
        (ArgKind::Splits, false) => "Sequence[int]",
        (ArgKind::Splits, true) => "list[int]",
        (ArgKind::Persistent, _) => "AllGatherPHandle",
    }
}

fn op_names() -> String {
    OPS.iter()
        .map(|op| format!("    {}: ClassVar[OpName]\n", op.name))
        .collect()
}

fn hook_record(op: &OpSpec) -> String {
    let class: String = op
        .name
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    let mut out = format!("class {class}PreHookArgs:\n");
    for (field, from) in op.hook.iter().filter(|(f, _)| !f.starts_with('_')) {
        let kind = op
            .kind_of(from)
            .expect("the table names its hook's arguments");
        out.push_str(&format!("    {field}: {}\n", py_type(kind, true)));
    }
    out.push_str("    async_op: bool\n\n");
    out
}

fn hook_records() -> String {
    OPS.iter().map(hook_record).collect()
}

fn methods() -> String {
    OPS.iter()
        .map(|op| {
            let args: String = op
                .args
                .iter()
                .map(|a| format!("{}: {}, ", a.name, py_type(a.kind, false)))
                .collect();
            format!(
                "    def {}(self, {args}async_op: bool, hints: _Hints = None, timeout: _Timeout = None) -> TorchWork: ...\n",
                op.name
            )
        })
        .collect()
}

/// The stub with every generated section replaced by what the table gives, in order.
fn regenerate(stub: &str) -> String {
    let sections = [op_names(), hook_records(), methods()];
    let mut out = String::new();
    let mut rest = stub;
    for (i, body) in sections.iter().enumerate() {
        let begin = rest
            .find(BEGIN)
            .unwrap_or_else(|| panic!("section {i}: no `{BEGIN}` marker"));
        let body_at = begin + rest[begin..].find('\n').expect("marker line ends") + 1;
        let end = rest[body_at..]
            .find(END)
            .unwrap_or_else(|| panic!("section {i}: no `{END}` marker"))
            + body_at;
        let end_line = rest[..end].rfind('\n').map_or(0, |n| n + 1);
        out.push_str(&rest[..body_at]);
        out.push_str(body);
        rest = &rest[end_line..];
    }
    assert!(
        !rest.contains(BEGIN),
        "more generated sections than this test writes"
    );
    out.push_str(rest);
    out
}

#[test]
fn generated_sections_match_the_table() {
    let path = stub_path();
    let committed = std::fs::read_to_string(&path).expect("read _comms.pyi");
    let fresh = regenerate(&committed);
    if std::env::var_os("TORCHCOMMS_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write _comms.pyi");
        return;
    }
    assert!(
        committed == fresh,
        "{} is out of date with the table of operations; regenerate with \
         TORCHCOMMS_BLESS=1 cargo test -p torchcomms-python --test stubs",
        path.display()
    );
}
