//! Operation descriptions: the [table](table) every surface is generated from, and [`OPS`], its
//! metadata (names, upstream ids, arguments and their kinds, hook records, docs) for tools
//! that generate or check text: the `.pyi` stubs and the C header.

pub mod table;

/// What an argument of an operation is; each surface maps a kind to its own type (API:
/// `&Tensor`, Python: `torch.Tensor`, C: `tc_tensor_t`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// One tensor.
    Tensor,
    /// A list of tensors (one per rank, or empty where the operation allows it).
    Tensors,
    /// A rank of the communicator (a root or a peer).
    Rank,
    /// A reduction operator.
    ReduceOp,
    /// Split sizes (one per rank).
    Splits,
    /// The handle of a persistent all-gather (`all_gather_p_init`).
    Persistent,
}

/// One argument of an operation.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    /// Its name (upstream's).
    pub name: &'static str,
    /// Its kind.
    pub kind: ArgKind,
}

/// One operation of the table.
#[derive(Debug, Clone, Copy)]
pub struct OpSpec {
    /// Its name (`all_reduce`).
    pub name: &'static str,
    /// Upstream's `OpName` value.
    pub id: u32,
    /// Its documentation, one line per doc-comment line.
    pub doc: &'static [&'static str],
    /// Its arguments, in order (every surface adds `async_op`, hints and timeout or options).
    pub args: &'static [ArgSpec],
    /// The pre-hook record's fields and the argument each comes from (`_x` fields are hidden).
    pub hook: &'static [(&'static str, &'static str)],
}

impl OpSpec {
    /// The operation named `name`.
    pub fn find(name: &str) -> Option<&'static OpSpec> {
        OPS.iter().find(|o| o.name == name)
    }

    /// The kind of argument `arg`.
    pub fn kind_of(&self, arg: &str) -> Option<ArgKind> {
        self.args.iter().find(|a| a.name == arg).map(|a| a.kind)
    }
}

macro_rules! op_specs {
    ($([$name:ident $id:literal [$($doc:literal)*] [$($arg:ident $kind:ident)*] [$($field:ident $from:ident)*] $($rest:tt)*])*) => {
        /// Every operation of the table, in upstream's `OpName` order.
        pub const OPS: &[OpSpec] = &[$(
            OpSpec {
                name: stringify!($name),
                id: $id,
                doc: &[$($doc),*],
                args: &[$(ArgSpec { name: stringify!($arg), kind: ArgKind::$kind }),*],
                hook: &[$((stringify!($field), stringify!($from))),*],
            }
        ),*];
    };
}

crate::for_each_op!(op_specs);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_ids_are_unique_and_hooks_name_arguments() {
        for (i, a) in OPS.iter().enumerate() {
            for b in &OPS[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.id, b.id);
            }
            assert!(!a.doc.is_empty(), "{} has no doc", a.name);
            for (field, from) in a.hook {
                assert!(
                    a.kind_of(from).is_some(),
                    "{}: hook field {field} from unknown {from}",
                    a.name
                );
            }
        }
        assert_eq!(OpSpec::find("all_reduce").map(|o| o.id), Some(3));
        assert_eq!(
            OpSpec::find("all_to_all_v_single").and_then(|o| o.kind_of("input_split_sizes")),
            Some(ArgKind::Splits)
        );
    }
}
