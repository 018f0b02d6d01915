//! The call of a collective that every rank must agree on, for finding mismatches.

use colltrace::schema::Record;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Signature {
    op: String,
    dtype: Option<String>,
    count: Option<u64>,
    bytes: Option<u64>,
    root: Option<usize>,
    reduce_op: Option<String>,
}

impl Signature {
    pub(super) fn of(r: &Record) -> Signature {
        // The size all ranks must pass: the buffer (all_reduce, reduce, broadcast), the gathered
        // output (all_gather), the whole input (reduce_scatter), the piece (scatter, gather);
        // all_to_all sizes may differ per rank.
        let bytes = match r.op.as_str() {
            "all_reduce" | "reduce" | "broadcast" | "reduce_scatter" | "gather" => Some(r.in_bytes),
            "all_gather" | "scatter" => Some(r.out_bytes),
            _ => None,
        };
        let count = match r.op.as_str() {
            "all_reduce" | "reduce" => r.count,
            _ => None,
        };
        Signature {
            op: r.op.clone(),
            dtype: r.dtype.clone(),
            count,
            bytes,
            root: r.root,
            reduce_op: r.reduce_op.clone(),
        }
    }

    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(d) = &self.dtype {
            parts.push(d.clone());
        }
        if let Some(c) = self.count {
            parts.push(format!("{c} elements"));
        }
        if let Some(b) = self.bytes {
            parts.push(format!("{b} B"));
        }
        if let Some(r) = self.root {
            parts.push(format!("root {r}"));
        }
        if let Some(o) = &self.reduce_op {
            parts.push(o.clone());
        }
        if parts.is_empty() {
            self.op.clone()
        } else {
            format!("{} ({})", self.op, parts.join(", "))
        }
    }

    pub(super) fn differences(&self, o: &Signature) -> Vec<&'static str> {
        let mut d = Vec::new();
        if self.op != o.op {
            d.push("op");
        }
        if self.dtype != o.dtype {
            d.push("dtype");
        }
        if self.count != o.count {
            d.push("count");
        }
        if self.bytes != o.bytes {
            d.push("bytes");
        }
        if self.root != o.root {
            d.push("root");
        }
        if self.reduce_op != o.reduce_op {
            d.push("reduce_op");
        }
        d
    }
}
