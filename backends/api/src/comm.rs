//! `TorchComm`: the communicator users hold. It checks every argument (naming the argument and
//! what was expected), then hands the call to its backend.

use std::sync::atomic::{AtomicBool, Ordering};

use ctran::{DataType, Device, ReduceOp};

use crate::backend::{Backend, P2POp};
use crate::error::{Error, Result};
use crate::options::{CommOptions, OpOptions};
use crate::tensor::Tensor;
use crate::work::Work;

/// A communicator: a group of ranks that run collectives together.
#[derive(Debug)]
pub struct TorchComm {
    backend: Box<dyn Backend>,
    backend_name: String,
    options: CommOptions,
    finalized: AtomicBool,
}

/// Argument checks shared by the operations, each naming the op and argument.
struct Check<'a> {
    op: &'a str,
    comm: &'a TorchComm,
}

impl Check<'_> {
    fn fail(&self, arg: &str, expected: impl Into<String>, got: impl ToString) -> Error {
        Error::invalid(self.op, arg, expected, got)
    }

    fn tensor(&self, arg: &str, t: &Tensor) -> Result<()> {
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

    fn same_dtype(&self, arg: &str, t: &Tensor, dtype: DataType) -> Result<()> {
        if t.dtype() != dtype {
            return Err(self.fail(
                arg,
                format!("dtype {dtype} (like the other tensors)"),
                t.dtype(),
            ));
        }
        Ok(())
    }

    fn numel(&self, arg: &str, t: &Tensor, want: usize) -> Result<()> {
        if t.numel() != want {
            return Err(self.fail(
                arg,
                format!("{want} elements"),
                format!("{} elements", t.numel()),
            ));
        }
        Ok(())
    }

    fn rank(&self, arg: &str, r: usize) -> Result<()> {
        let n = self.comm.get_size();
        if r >= n {
            return Err(self.fail(arg, format!("{arg} must be in range [0, {n})"), r));
        }
        Ok(())
    }

    fn peer(&self, arg: &str, r: usize) -> Result<()> {
        self.rank(arg, r)?;
        if r == self.comm.get_rank() {
            return Err(self.fail(arg, "a rank other than this one (no send/recv to self)", r));
        }
        Ok(())
    }

    fn list(&self, arg: &str, ts: &[Tensor], dtype: DataType) -> Result<()> {
        let n = self.comm.get_size();
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

    fn reduce_op(&self, op: ReduceOp, dtype: DataType) -> Result<()> {
        let bad_bool =
            dtype == DataType::Bool && matches!(op, ReduceOp::Avg | ReduceOp::PremulSum { .. });
        if (op.is_bitwise() && dtype.is_float()) || bad_bool {
            let expected = if bad_bool {
                "a reduce op that applies to bool (sum, prod, min, max, band, bor, bxor)"
            } else {
                "a bitwise reduce op (band, bor, bxor) only on integer or bool tensors"
            };
            return Err(self.fail("op", expected, format!("{} on {}", op.name(), dtype)));
        }
        if let ReduceOp::PremulSum { factor } = op {
            if !factor.is_finite() {
                return Err(self.fail("op", "PREMUL_SUM with a finite factor", factor));
            }
        }
        Ok(())
    }

    fn disjoint(&self, a_arg: &str, a: &[Tensor], b_arg: &str, b: &[Tensor]) -> Result<()> {
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
}

impl TorchComm {
    /// Wraps a backend (see [`crate::new_comm`]).
    pub fn new(backend: Box<dyn Backend>, backend_name: &str, options: CommOptions) -> TorchComm {
        TorchComm {
            backend,
            backend_name: backend_name.into(),
            options,
            finalized: AtomicBool::new(false),
        }
    }

    fn check(&self, op: &'static str) -> Result<Check<'_>> {
        if self.finalized.load(Ordering::Acquire) {
            return Err(Error::Finalized {
                op: op.into(),
                comm: self.get_name().into(),
            });
        }
        Ok(Check { op, comm: self })
    }

    fn opts(&self, o: &OpOptions) -> OpOptions {
        OpOptions {
            timeout: Some(o.timeout_or(self.options.timeout)),
            ..o.clone()
        }
    }

    /// This rank.
    pub fn get_rank(&self) -> usize {
        self.backend.rank()
    }
    /// Number of ranks.
    pub fn get_size(&self) -> usize {
        self.backend.size()
    }
    /// Name given at creation.
    pub fn get_name(&self) -> &str {
        self.backend.comm_name()
    }
    /// The device this communicator serves.
    pub fn device(&self) -> Device {
        self.backend.device()
    }
    /// The backend name passed to `new_comm` (inherited by split children).
    pub fn get_backend(&self) -> &str {
        &self.backend_name
    }
    /// Version of the engine behind the backend.
    pub fn get_backend_version(&self) -> Result<String> {
        self.backend.version()
    }
    /// The options this communicator was created with.
    pub fn get_options(&self) -> &CommOptions {
        &self.options
    }
    /// The backend (for backend-specific calls).
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// In-place all-reduce of `tensor`.
    pub fn all_reduce(&self, tensor: &Tensor, op: ReduceOp, opts: &OpOptions) -> Result<Work> {
        let c = self.check("all_reduce")?;
        c.tensor("tensor", tensor)?;
        c.reduce_op(op, tensor.dtype())?;
        self.backend.all_reduce(tensor, op, &self.opts(opts))
    }

    /// Reduce of `tensor` onto `root`; other ranks' tensors are unchanged.
    pub fn reduce(
        &self,
        tensor: &Tensor,
        root: usize,
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("reduce")?;
        c.tensor("tensor", tensor)?;
        c.rank("root", root)?;
        c.reduce_op(op, tensor.dtype())?;
        self.backend.reduce(tensor, root, op, &self.opts(opts))
    }

    /// Broadcast of `root`'s `tensor`.
    pub fn broadcast(&self, tensor: &Tensor, root: usize, opts: &OpOptions) -> Result<Work> {
        let c = self.check("broadcast")?;
        c.tensor("tensor", tensor)?;
        c.rank("root", root)?;
        self.backend.broadcast(tensor, root, &self.opts(opts))
    }

    /// All-gather of equal-sized tensors into `outputs` (one per rank).
    pub fn all_gather(&self, outputs: &[Tensor], input: &Tensor, opts: &OpOptions) -> Result<Work> {
        let c = self.check("all_gather")?;
        c.tensor("tensor", input)?;
        c.list("tensor_list", outputs, input.dtype())?;
        for (i, o) in outputs.iter().enumerate() {
            c.numel(&format!("tensor_list[{i}]"), o, input.numel())?;
        }
        self.backend.all_gather(outputs, input, &self.opts(opts))
    }

    /// All-gather where ranks contribute different sizes; `outputs[rank]` must match `input`.
    pub fn all_gather_v(
        &self,
        outputs: &[Tensor],
        input: &Tensor,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("all_gather_v")?;
        c.tensor("tensor", input)?;
        c.list("tensor_list", outputs, input.dtype())?;
        let me = self.get_rank();
        c.numel(&format!("tensor_list[{me}]"), &outputs[me], input.numel())?;
        self.backend.all_gather(outputs, input, &self.opts(opts))
    }

    /// All-gather into one tensor holding `size` blocks of `input`'s size.
    pub fn all_gather_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("all_gather_single")?;
        c.tensor("input", input)?;
        c.tensor("output", output)?;
        c.same_dtype("output", output, input.dtype())?;
        c.numel("output", output, input.numel() * self.get_size())?;
        self.backend
            .all_gather_single(output, input, &self.opts(opts))
    }

    /// Reduce-scatter of equal-sized `inputs` (one per rank) into `output`.
    pub fn reduce_scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("reduce_scatter")?;
        c.tensor("output", output)?;
        c.list("input_list", inputs, output.dtype())?;
        for (i, t) in inputs.iter().enumerate() {
            c.numel(&format!("input_list[{i}]"), t, output.numel())?;
        }
        c.reduce_op(op, output.dtype())?;
        self.backend
            .reduce_scatter(output, inputs, op, &self.opts(opts))
    }

    /// Reduce-scatter where blocks differ in size; `inputs[rank]` must match `output`.
    pub fn reduce_scatter_v(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("reduce_scatter_v")?;
        c.tensor("output", output)?;
        c.list("input_list", inputs, output.dtype())?;
        let me = self.get_rank();
        c.numel(&format!("input_list[{me}]"), &inputs[me], output.numel())?;
        c.reduce_op(op, output.dtype())?;
        self.backend
            .reduce_scatter(output, inputs, op, &self.opts(opts))
    }

    /// Reduce-scatter of one tensor of `size` blocks of `output`'s size.
    pub fn reduce_scatter_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("reduce_scatter_single")?;
        c.tensor("output", output)?;
        c.tensor("input", input)?;
        c.same_dtype("input", input, output.dtype())?;
        c.numel("input", input, output.numel() * self.get_size())?;
        c.reduce_op(op, output.dtype())?;
        let exact_alias = output.addr() == input.addr() + self.get_rank() * output.nbytes();
        if !exact_alias {
            c.disjoint(
                "input",
                std::slice::from_ref(input),
                "output",
                std::slice::from_ref(output),
            )?;
        }
        self.backend
            .reduce_scatter_single(output, input, op, &self.opts(opts))
    }

    /// All-to-all of lists (block `j` of `inputs` goes to rank `j`).
    pub fn all_to_all(
        &self,
        outputs: &[Tensor],
        inputs: &[Tensor],
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("all_to_all")?;
        let dtype = inputs
            .first()
            .or(outputs.first())
            .map_or(DataType::F32, Tensor::dtype);
        c.list("input_tensor_list", inputs, dtype)?;
        c.list("output_tensor_list", outputs, dtype)?;
        let me = self.get_rank();
        c.numel(
            &format!("output_tensor_list[{me}]"),
            &outputs[me],
            inputs[me].numel(),
        )?;
        c.disjoint("input_tensor_list", inputs, "output_tensor_list", outputs)?;
        self.backend.all_to_all(outputs, inputs, &self.opts(opts))
    }

    /// All-to-all of one tensor split into `size` equal blocks.
    pub fn all_to_all_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("all_to_all_single")?;
        c.tensor("input", input)?;
        c.tensor("output", output)?;
        c.same_dtype("output", output, input.dtype())?;
        c.numel("output", output, input.numel())?;
        let n = self.get_size();
        if input.numel() % n != 0 {
            return Err(c.fail(
                "input",
                format!("a number of elements divisible by the {n} ranks"),
                input.numel(),
            ));
        }
        c.disjoint(
            "input",
            std::slice::from_ref(input),
            "output",
            std::slice::from_ref(output),
        )?;
        let block = input.numel() / n;
        let splits = vec![block; n];
        self.backend
            .all_to_all_v_single(output, input, &splits, &splits, &self.opts(opts))
    }

    /// All-to-all with split sizes counted in rows of dimension 0 (torchcomms' convention).
    pub fn all_to_all_v_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        output_split_sizes: &[usize],
        input_split_sizes: &[usize],
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("all_to_all_v_single")?;
        c.tensor("input", input)?;
        c.tensor("output", output)?;
        c.same_dtype("output", output, input.dtype())?;
        let n = self.get_size();
        for (arg, splits, t) in [
            ("output_split_sizes", output_split_sizes, output),
            ("input_split_sizes", input_split_sizes, input),
        ] {
            if splits.len() != n {
                return Err(c.fail(
                    arg,
                    format!("{n} split sizes (one per rank)"),
                    format!("{} sizes", splits.len()),
                ));
            }
            let rows: usize = splits.iter().sum();
            if rows > t.rows() {
                return Err(c.fail(
                    arg,
                    format!("split sizes summing to at most {} rows", t.rows()),
                    format!("a sum of {rows}"),
                ));
            }
        }
        if input.row_numel() != output.row_numel() && input.numel() > 0 && output.numel() > 0 {
            return Err(c.fail(
                "output",
                format!("rows of {} elements like the input", input.row_numel()),
                output.row_numel(),
            ));
        }
        c.disjoint(
            "input",
            std::slice::from_ref(input),
            "output",
            std::slice::from_ref(output),
        )?;
        let out_el: Vec<usize> = output_split_sizes
            .iter()
            .map(|r| r * output.row_numel())
            .collect();
        let in_el: Vec<usize> = input_split_sizes
            .iter()
            .map(|r| r * input.row_numel())
            .collect();
        self.backend
            .all_to_all_v_single(output, input, &out_el, &in_el, &self.opts(opts))
    }

    /// Scatter of `root`'s `inputs` (ignored elsewhere; may be empty).
    pub fn scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("scatter")?;
        c.tensor("output_tensor", output)?;
        c.rank("root", root)?;
        if self.get_rank() == root {
            c.list("input_tensor_list", inputs, output.dtype())?;
            for (i, t) in inputs.iter().enumerate() {
                c.numel(&format!("input_tensor_list[{i}]"), t, output.numel())?;
            }
        }
        let inputs = if self.get_rank() == root { inputs } else { &[] };
        self.backend.scatter(output, inputs, root, &self.opts(opts))
    }

    /// Gather onto `root`'s `outputs` (ignored elsewhere; may be empty).
    pub fn gather(
        &self,
        outputs: &[Tensor],
        input: &Tensor,
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("gather")?;
        c.tensor("input_tensor", input)?;
        c.rank("root", root)?;
        if self.get_rank() == root {
            c.list("output_tensor_list", outputs, input.dtype())?;
            for (i, t) in outputs.iter().enumerate() {
                c.numel(&format!("output_tensor_list[{i}]"), t, input.numel())?;
            }
        }
        let outputs = if self.get_rank() == root {
            outputs
        } else {
            &[]
        };
        self.backend.gather(outputs, input, root, &self.opts(opts))
    }

    /// Gather into one tensor of `size` blocks on `root` (torchcomms' default: chunks of dim 0).
    pub fn gather_single(
        &self,
        output: &Tensor,
        input: &Tensor,
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let c = self.check("gather_single")?;
        c.tensor("input", input)?;
        c.rank("root", root)?;
        let n = input.numel();
        let outs: Vec<Tensor> = if self.get_rank() == root {
            c.tensor("output", output)?;
            c.same_dtype("output", output, input.dtype())?;
            c.numel("output", output, n * self.get_size())?;
            (0..self.get_size())
                .map(|r| output.narrow(r * n, n))
                .collect()
        } else {
            Vec::new()
        };
        self.backend.gather(&outs, input, root, &self.opts(opts))
    }

    /// Barrier.
    pub fn barrier(&self, opts: &OpOptions) -> Result<Work> {
        self.check("barrier")?;
        self.backend.barrier(&self.opts(opts))
    }

    /// Send `tensor` to `dst`.
    pub fn send(&self, tensor: &Tensor, dst: usize, opts: &OpOptions) -> Result<Work> {
        let c = self.check("send")?;
        c.tensor("tensor", tensor)?;
        c.peer("dst", dst)?;
        self.backend.send(tensor, dst, &self.opts(opts))
    }

    /// Receive into `tensor` from `src`.
    pub fn recv(&self, tensor: &Tensor, src: usize, opts: &OpOptions) -> Result<Work> {
        let c = self.check("recv")?;
        c.tensor("tensor", tensor)?;
        c.peer("src", src)?;
        self.backend.recv(tensor, src, &self.opts(opts))
    }

    /// Runs a batch of sends and receives concurrently.
    pub fn batch_p2p(&self, ops: &[P2POp], opts: &OpOptions) -> Result<Work> {
        let c = self.check("batch_op_issue")?;
        if ops.is_empty() {
            return Err(c.fail(
                "ops",
                "at least one send or recv in the batch",
                "an empty batch",
            ));
        }
        for (i, op) in ops.iter().enumerate() {
            c.tensor(&format!("ops[{i}].tensor"), op.tensor())?;
            c.peer(&format!("ops[{i}].peer"), op.peer())?;
        }
        self.backend.batch_p2p(ops, &self.opts(opts))
    }

    /// Starts a batch of point-to-point operations.
    pub fn batch_op_create(&self) -> crate::batch::BatchSendRecv<'_> {
        crate::batch::BatchSendRecv::new(self)
    }

    /// Splits off a communicator of `ranks` (ranks of this communicator). A collective: every
    /// rank calls it; ranks passing an empty list get `None`. The new rank is the position of
    /// this rank in `ranks`. The child gets fresh default options plus the given ones.
    pub fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: Option<CommOptions>,
    ) -> Result<Option<TorchComm>> {
        let c = self.check("split")?;
        let n = self.get_size();
        let mut seen = vec![false; n];
        for &r in ranks {
            if r >= n {
                return Err(c.fail("ranks", format!("ranks in range [0, {n})"), r));
            }
            if std::mem::replace(&mut seen[r], true) {
                return Err(c.fail("ranks", "a list without duplicates", format!("{ranks:?}")));
            }
        }
        if !ranks.is_empty() && !seen[self.get_rank()] {
            return Err(c.fail(
                "ranks",
                format!(
                    "a list that contains this rank ({}) or is empty",
                    self.get_rank()
                ),
                format!("{ranks:?}"),
            ));
        }
        if name.is_empty() {
            return Err(c.fail("name", "a non-empty name", "\"\""));
        }
        let options = options.unwrap_or_default();
        let child = self.backend.split(ranks, name, options.clone())?;
        Ok(child.map(|b| TorchComm::new(b, &self.backend_name, options)))
    }

    /// Waits for outstanding work and releases the communicator; later operations fail.
    pub fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.backend.finalize()
    }

    /// True after [`TorchComm::finalize`].
    pub fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }

    /// Whether the backend can abort.
    pub fn is_abort_supported(&self) -> bool {
        self.backend.supports_abort()
    }

    /// Fails outstanding and future work.
    pub fn abort(&self) -> Result<()> {
        self.backend.abort()
    }

    /// True once aborted.
    pub fn is_aborted(&self) -> bool {
        self.backend.is_aborted()
    }
}
