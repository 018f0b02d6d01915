//! Argument checks of the operations, each naming the operation, the argument and what was
//! expected. The table's `check` blocks ([`torchcomms_core::for_each_op`]) are written with
//! these.

use torchcomms_core::{DataType, Device, ReduceOp};

use crate::comm::TorchComm;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The checks of one operation call on one communicator.
#[derive(Debug)]
pub struct Check<'a> {
    op: &'a str,
    comm: &'a TorchComm,
}

impl<'a> Check<'a> {
    pub(crate) fn new(op: &'a str, comm: &'a TorchComm) -> Self {
        Check { op, comm }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.get_rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.comm.get_size()
    }

    /// The communicator's name.
    pub fn comm_name(&self) -> &str {
        self.comm.get_name()
    }

    /// An invalid-argument error for `arg`.
    pub fn fail(&self, arg: &str, expected: impl Into<String>, got: impl ToString) -> Error {
        Error::invalid(self.op, arg, expected, got)
    }

    /// A contiguous tensor on the communicator's device, with memory unless empty.
    pub fn tensor(&self, arg: &str, t: &Tensor) -> Result<()> {
        if !t.is_contiguous() {
            return Err(self.fail(arg, "a contiguous tensor", "a non-contiguous tensor"));
        }
        let dev = self.comm.device();
        let same_kind = matches!(
            (t.device(), dev),
            (Device::Cpu, Device::Cpu) | (Device::Cuda(_), Device::Cuda(_))
        );
        if !same_kind || (t.device() != dev && matches!(dev, Device::Cuda(_))) {
            return Err(self.fail(
                arg,
                format!("a tensor on {dev} (the communicator's device)"),
                t.device(),
            ));
        }
        if t.numel() > 0 && t.addr() == 0 {
            return Err(self.fail(arg, "a tensor with memory", "a null pointer"));
        }
        Ok(())
    }

    /// Row counts one per rank: a contiguous int64 tensor of `size` elements on the
    /// communicator's device.
    pub fn counts(&self, arg: &str, t: &Tensor) -> Result<()> {
        self.tensor(arg, t)?;
        if t.dtype() != DataType::I64 {
            return Err(self.fail(arg, "an int64 tensor of row counts", t.dtype()));
        }
        self.numel(arg, t, self.size())
    }

    /// `t` has element type `dtype`.
    pub fn same_dtype(&self, arg: &str, t: &Tensor, dtype: DataType) -> Result<()> {
        if t.dtype() != dtype {
            return Err(self.fail(
                arg,
                format!("dtype {dtype} (like the other tensors)"),
                t.dtype(),
            ));
        }
        Ok(())
    }

    /// `t` has `want` elements.
    pub fn numel(&self, arg: &str, t: &Tensor, want: usize) -> Result<()> {
        if t.numel() != want {
            return Err(self.fail(
                arg,
                format!("{want} elements"),
                format!("{} elements", t.numel()),
            ));
        }
        Ok(())
    }

    /// `t` has `per_rank` elements for every rank.
    pub fn numel_times_size(&self, arg: &str, t: &Tensor, per_rank: usize) -> Result<()> {
        let want = per_rank.checked_mul(self.size()).ok_or_else(|| {
            self.fail(
                arg,
                "a size that fits in memory",
                format!("{per_rank} x {} elements", self.size()),
            )
        })?;
        self.numel(arg, t, want)
    }

    /// Every tensor of `ts` has `want` elements.
    pub fn numel_each(&self, arg: &str, ts: &[Tensor], want: usize) -> Result<()> {
        for (i, t) in ts.iter().enumerate() {
            self.numel(&format!("{arg}[{i}]"), t, want)?;
        }
        Ok(())
    }

    /// `ts[i]` has `want` elements (`ts` was checked to hold one tensor per rank).
    pub fn numel_at(&self, arg: &str, ts: &[Tensor], i: usize, want: usize) -> Result<()> {
        self.numel(&format!("{arg}[{i}]"), &ts[i], want)
    }

    /// `t`'s elements split into one equal block per rank.
    pub fn divisible_by_size(&self, arg: &str, t: &Tensor) -> Result<()> {
        let n = self.size();
        if t.numel() % n != 0 {
            return Err(self.fail(
                arg,
                format!("a number of elements divisible by the {n} ranks"),
                t.numel(),
            ));
        }
        Ok(())
    }

    /// A root: a rank of the communicator.
    pub fn root(&self, arg: &str, r: usize) -> Result<()> {
        let n = self.size();
        if r >= n {
            return Err(self.fail(arg, format!("{arg} must be in range [0, {n})"), r));
        }
        Ok(())
    }

    /// A peer: a rank of the communicator other than this one.
    pub fn peer(&self, arg: &str, r: usize) -> Result<()> {
        self.root(arg, r)?;
        if r == self.rank() {
            return Err(self.fail(arg, "a rank other than this one (no send/recv to self)", r));
        }
        Ok(())
    }

    /// One tensor per rank, each checked by [`Check::tensor`] and of element type `dtype`.
    pub fn list(&self, arg: &str, ts: &[Tensor], dtype: DataType) -> Result<()> {
        let n = self.size();
        if ts.len() != n {
            return Err(self.fail(
                arg,
                format!("a list of {n} tensors (one per rank)"),
                format!("{} tensors", ts.len()),
            ));
        }
        for (i, t) in ts.iter().enumerate() {
            let name = format!("{arg}[{i}]");
            self.tensor(&name, t)?;
            self.same_dtype(&name, t, dtype)?;
        }
        Ok(())
    }

    /// The element type two lists should share: the first tensor's of either (checked by
    /// [`Check::list`] after).
    pub fn dtype_of_lists(&self, a: &[Tensor], b: &[Tensor]) -> DataType {
        a.first().or(b.first()).map_or(DataType::F32, Tensor::dtype)
    }

    /// `op` applies to `dtype`.
    pub fn reduce_op(&self, op: ReduceOp, dtype: DataType) -> Result<()> {
        op.check_dtype(dtype).map_err(|e| match e {
            torchcomms_core::Error::InvalidArgument { expected, got, .. } => {
                self.fail("op", expected, got)
            }
            e => e.into(),
        })
    }

    /// No tensor of `a` overlaps a tensor of `b`.
    pub fn disjoint(&self, a_arg: &str, a: &[Tensor], b_arg: &str, b: &[Tensor]) -> Result<()> {
        for x in a {
            for y in b {
                if x.span().overlaps(&y.span()) {
                    return Err(self.fail(
                        b_arg,
                        format!("memory that does not overlap `{a_arg}`"),
                        "overlapping tensors",
                    ));
                }
            }
        }
        Ok(())
    }

    /// One split size per rank, in rows of `t`, summing to at most `t`'s rows.
    pub fn splits(&self, arg: &str, splits: &[usize], t: &Tensor) -> Result<()> {
        let n = self.size();
        if splits.len() != n {
            return Err(self.fail(
                arg,
                format!("{n} split sizes (one per rank)"),
                format!("{} sizes", splits.len()),
            ));
        }
        let rows = splits
            .iter()
            .try_fold(0usize, |sum, &s| sum.checked_add(s))
            .filter(|&rows| rows <= t.rows());
        if rows.is_none() {
            return Err(self.fail(
                arg,
                format!("split sizes summing to at most {} rows", t.rows()),
                format!("{splits:?}"),
            ));
        }
        Ok(())
    }

    /// The block this rank sends itself (`sent` elements, named by `arg`) is as large as the
    /// block it receives from itself (`received`): the engine copies it locally, so a mismatch
    /// would overrun the output instead of failing on the wire.
    pub fn own_block(&self, arg: &str, sent: usize, received: usize) -> Result<()> {
        if sent != received {
            return Err(self.fail(
                arg,
                format!(
                    "this rank's own block ([{}]) of {received} elements, as the output expects",
                    self.rank()
                ),
                format!("{sent} elements"),
            ));
        }
        Ok(())
    }

    /// `a`'s rows hold as many elements as `b`'s (unless either is empty).
    pub fn same_rows(&self, arg: &str, a: &Tensor, b: &Tensor) -> Result<()> {
        if a.row_numel() != b.row_numel() && a.numel() > 0 && b.numel() > 0 {
            return Err(self.fail(
                arg,
                format!("rows of {} elements like the input", b.row_numel()),
                a.row_numel(),
            ));
        }
        Ok(())
    }

    /// `ts` on `root`, nothing elsewhere (rooted operations ignore the list off the root).
    pub fn on_root(&self, root: usize, ts: &[Tensor]) -> Vec<Tensor> {
        if self.rank() == root {
            ts.to_vec()
        } else {
            Vec::new()
        }
    }
}
