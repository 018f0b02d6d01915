//! The table of operations: every operation that returns a work handle, described once.
//!
//! [`for_each_op!`](crate::for_each_op) hands the whole table to a macro of the caller's, which
//! turns it into that layer's surface: the API's checked methods (crate `torchcomms`), the
//! Python methods and hook-argument classes, the C functions, and this crate's [`OPS`] metadata
//! (from which the `.pyi` stubs and the C header's prototypes are generated and checked).
//!
//! A row reads:
//!
//! ```text
//! /// Doc comment (every surface shows it).
//! name = id (arg: Kind, ...)          // upstream's argument names and order; id = upstream's OpName
//!     hook { field: arg, ... }        // the pre-hook's record: upstream's field names ("_x" = hidden)
//!     check |c| { ... }               // argument checks, in terms of `torchcomms::comm::Check`
//!     call { ... }                    // the backend call it becomes (`torchcomms::Call`)
//! ```
//!
//! Argument kinds ([`ArgKind`]): `Tensor`, `Tensors` (one per rank), `Rank` (a root or a peer),
//! `ReduceOp`, `Splits` (split sizes), `Persistent` (a persistent all-gather's handle). In `check`
//! and `call` the arguments are the API's types (`&Tensor`, `&[Tensor]`, `usize`, `ReduceOp`,
//! `&[usize]`, `&AllGatherP`); those blocks are Rust code of the
//! `torchcomms` crate and compile where it expands the table. A new operation is a row here,
//! its engine implementation and its tests.
//!
//! [`OPS`]: crate::ops::OPS
//! [`ArgKind`]: crate::ops::ArgKind

/// Calls `$callback! { rows }` with every row of the table (see the [module](crate::ops::table)),
/// each row as one bracketed group, so a surface matches only the parts it uses:
///
/// ```text
/// [name id [doc-lines] [arg Kind ...] [field from ...] [c { check }] [{ call }]]
/// ```
#[macro_export]
macro_rules! for_each_op {
    ($callback:path) => {
        $crate::__op_rows! { $callback;
            /// Sends `tensor` to rank `dst`.
            send = 0 (tensor: Tensor, dst: Rank)
                hook { tensor: tensor, peer: dst }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.peer("dst", dst)?;
                }
                call { Call::Send { tensor: tensor.clone(), peer: dst } }

            /// Receives into `tensor` from rank `src`.
            recv = 1 (tensor: Tensor, src: Rank)
                hook { tensor: tensor, peer: src }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.peer("src", src)?;
                }
                call { Call::Recv { tensor: tensor.clone(), peer: src } }

            /// Broadcasts `root`'s `tensor` to every rank, in place.
            broadcast = 2 (tensor: Tensor, root: Rank)
                hook { tensor: tensor, root: root }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.root("root", root)?;
                }
                call { Call::Broadcast { tensor: tensor.clone(), root } }

            /// Reduces `tensor` over every rank with `op`, in place.
            all_reduce = 3 (tensor: Tensor, op: ReduceOp)
                hook { tensor: tensor, _op: op }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.reduce_op(op, tensor.dtype())?;
                }
                call { Call::AllReduce { tensor: tensor.clone(), op } }

            /// Reduces `tensor` with `op` onto `root`; other ranks' tensors are left unchanged.
            reduce = 4 (tensor: Tensor, root: Rank, op: ReduceOp)
                hook { tensor: tensor, root: root, _op: op }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.root("root", root)?;
                    c.reduce_op(op, tensor.dtype())?;
                }
                call { Call::Reduce { tensor: tensor.clone(), root, op } }

            /// Gathers every rank's `tensor` into `tensor_list` (one tensor per rank, equal sizes).
            all_gather = 5 (tensor_list: Tensors, tensor: Tensor)
                hook { input: tensor, output: tensor_list }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.list("tensor_list", tensor_list, tensor.dtype())?;
                    c.numel_each("tensor_list", tensor_list, tensor.numel())?;
                }
                call { Call::AllGather { outputs: tensor_list.to_vec(), input: tensor.clone() } }

            /// Like `all_gather`, where ranks contribute different sizes: `tensor_list[rank]`
            /// matches `tensor`.
            all_gather_v = 6 (tensor_list: Tensors, tensor: Tensor)
                hook { input: tensor, output: tensor_list }
                check |c| {
                    c.tensor("tensor", tensor)?;
                    c.list("tensor_list", tensor_list, tensor.dtype())?;
                    c.numel_at("tensor_list", tensor_list, c.rank(), tensor.numel())?;
                }
                call { Call::AllGather { outputs: tensor_list.to_vec(), input: tensor.clone() } }

            /// Gathers every rank's `input` into `output` (size blocks of `input`'s elements, in
            /// rank order).
            all_gather_single = 7 (output: Tensor, input: Tensor)
                hook { input: input, output: output }
                check |c| {
                    c.tensor("input", input)?;
                    c.tensor("output", output)?;
                    c.same_dtype("output", output, input.dtype())?;
                    c.numel_times_size("output", output, input.numel())?;
                }
                call {
                    Call::AllGather {
                        outputs: output.blocks(c.size(), input.numel()),
                        input: input.clone(),
                    }
                }

            /// Reduces `input_list` (one tensor per rank, equal sizes) over every rank with `op`;
            /// this rank gets block `rank` in `output`.
            reduce_scatter = 8 (output: Tensor, input_list: Tensors, op: ReduceOp)
                hook { input: input_list, output: output, _op: op }
                check |c| {
                    c.tensor("output", output)?;
                    c.list("input_list", input_list, output.dtype())?;
                    c.numel_each("input_list", input_list, output.numel())?;
                    c.reduce_op(op, output.dtype())?;
                }
                call {
                    Call::ReduceScatter { output: output.clone(), inputs: input_list.to_vec(), op }
                }

            /// Like `reduce_scatter`, where blocks differ in size: `input_list[rank]` matches
            /// `output`.
            reduce_scatter_v = 9 (output: Tensor, input_list: Tensors, op: ReduceOp)
                hook { input: input_list, output: output, _op: op }
                check |c| {
                    c.tensor("output", output)?;
                    c.list("input_list", input_list, output.dtype())?;
                    c.numel_at("input_list", input_list, c.rank(), output.numel())?;
                    c.reduce_op(op, output.dtype())?;
                }
                call {
                    Call::ReduceScatter { output: output.clone(), inputs: input_list.to_vec(), op }
                }

            /// Reduces `input` (size blocks of `output`'s elements) over every rank with `op`;
            /// this rank gets block `rank` in `output`.
            reduce_scatter_single = 10 (output: Tensor, input: Tensor, op: ReduceOp)
                hook { input: input, output: output, _op: op }
                check |c| {
                    c.tensor("output", output)?;
                    c.tensor("input", input)?;
                    c.same_dtype("input", input, output.dtype())?;
                    c.numel_times_size("input", input, output.numel())?;
                    c.reduce_op(op, output.dtype())?;
                    // The output may be this rank's own block of the input, and nothing else of it.
                    if output.addr() != input.addr() + c.rank() * output.nbytes() {
                        c.disjoint("input", std::slice::from_ref(input), "output", std::slice::from_ref(output))?;
                    }
                }
                call {
                    Call::ReduceScatter {
                        output: output.clone(),
                        inputs: input.blocks(c.size(), output.numel()),
                        op,
                    }
                }

            /// Sends block `j` of `input` (size equal blocks) to rank `j`; block `i` of `output`
            /// comes from rank `i`.
            all_to_all_single = 11 (output: Tensor, input: Tensor)
                hook { input: input, output: output }
                check |c| {
                    c.tensor("input", input)?;
                    c.tensor("output", output)?;
                    c.same_dtype("output", output, input.dtype())?;
                    c.numel("output", output, input.numel())?;
                    c.divisible_by_size("input", input)?;
                    c.disjoint("input", std::slice::from_ref(input), "output", std::slice::from_ref(output))?;
                }
                call {
                    let block = input.numel() / c.size();
                    Call::AllToAll {
                        outputs: output.blocks(c.size(), block),
                        inputs: input.blocks(c.size(), block),
                        uniform: true,
                    }
                }

            /// All-to-all with split sizes counted in rows of dimension 0: `input_split_sizes[j]`
            /// rows go to rank `j`, `output_split_sizes[i]` rows come from rank `i`.
            all_to_all_v_single = 12 (
                output: Tensor,
                input: Tensor,
                output_split_sizes: Splits,
                input_split_sizes: Splits
            )
                hook {
                    input: input,
                    output: output,
                    input_split_sizes: input_split_sizes,
                    output_split_sizes: output_split_sizes
                }
                check |c| {
                    c.tensor("input", input)?;
                    c.tensor("output", output)?;
                    c.same_dtype("output", output, input.dtype())?;
                    c.splits("output_split_sizes", output_split_sizes, output)?;
                    c.splits("input_split_sizes", input_split_sizes, input)?;
                    c.same_rows("output", output, input)?;
                    // Lengths are checked above; the products fit: splits sum to at most the rows.
                    c.own_block(
                        "input_split_sizes",
                        input_split_sizes[c.rank()] * input.row_numel(),
                        output_split_sizes[c.rank()] * output.row_numel(),
                    )?;
                    c.disjoint("input", std::slice::from_ref(input), "output", std::slice::from_ref(output))?;
                }
                call {
                    Call::AllToAll {
                        outputs: output.split_rows(output_split_sizes),
                        inputs: input.split_rows(input_split_sizes),
                        uniform: false,
                    }
                }

            /// `input_tensor_list[j]` goes to rank `j`; `output_tensor_list[i]` comes from rank `i`.
            all_to_all = 13 (output_tensor_list: Tensors, input_tensor_list: Tensors)
                hook { input: input_tensor_list, output: output_tensor_list }
                check |c| {
                    let dtype = c.dtype_of_lists(input_tensor_list, output_tensor_list);
                    c.list("input_tensor_list", input_tensor_list, dtype)?;
                    c.list("output_tensor_list", output_tensor_list, dtype)?;
                    c.numel_at("output_tensor_list", output_tensor_list, c.rank(), input_tensor_list[c.rank()].numel())?;
                    c.disjoint("input_tensor_list", input_tensor_list, "output_tensor_list", output_tensor_list)?;
                }
                call {
                    Call::AllToAll {
                        outputs: output_tensor_list.to_vec(),
                        inputs: input_tensor_list.to_vec(),
                        uniform: false,
                    }
                }

            /// Returns once every rank has entered the barrier.
            barrier = 14 ()
                hook {}
                check |c| {}
                call { Call::Barrier }

            /// Scatters `root`'s `input_tensor_list` (one tensor per rank) into every rank's
            /// `output_tensor`; other ranks may pass an empty list.
            scatter = 15 (output_tensor: Tensor, input_tensor_list: Tensors, root: Rank)
                hook { output: output_tensor, input: input_tensor_list, root: root }
                check |c| {
                    c.tensor("output_tensor", output_tensor)?;
                    c.root("root", root)?;
                    if c.rank() == root {
                        c.list("input_tensor_list", input_tensor_list, output_tensor.dtype())?;
                        c.numel_each("input_tensor_list", input_tensor_list, output_tensor.numel())?;
                    }
                }
                call {
                    Call::Scatter {
                        output: output_tensor.clone(),
                        inputs: c.on_root(root, input_tensor_list),
                        root,
                    }
                }

            /// Gathers every rank's `input_tensor` into `root`'s `output_tensor_list` (one tensor
            /// per rank); other ranks may pass an empty list.
            gather = 16 (output_tensor_list: Tensors, input_tensor: Tensor, root: Rank)
                hook { input: input_tensor, output: output_tensor_list, root: root }
                check |c| {
                    c.tensor("input_tensor", input_tensor)?;
                    c.root("root", root)?;
                    if c.rank() == root {
                        c.list("output_tensor_list", output_tensor_list, input_tensor.dtype())?;
                        c.numel_each("output_tensor_list", output_tensor_list, input_tensor.numel())?;
                    }
                }
                call {
                    Call::Gather {
                        outputs: c.on_root(root, output_tensor_list),
                        input: input_tensor.clone(),
                        root,
                    }
                }

            /// Gathers every rank's `input` into `root`'s `output` (size blocks of `input`'s
            /// elements, in rank order).
            gather_single = 17 (output: Tensor, input: Tensor, root: Rank)
                hook { input: input, output: output, root: root }
                check |c| {
                    c.tensor("input", input)?;
                    c.root("root", root)?;
                    if c.rank() == root {
                        c.tensor("output", output)?;
                        c.same_dtype("output", output, input.dtype())?;
                        c.numel_times_size("output", output, input.numel())?;
                    }
                }
                call {
                    let outputs = if c.rank() == root {
                        output.blocks(c.size(), input.numel())
                    } else {
                        Vec::new()
                    };
                    Call::Gather { outputs, input: input.clone(), root }
                }

            /// Gathers every rank's `input` into the output bound by `all_gather_p_init` (size
            /// blocks of `input`'s elements, in rank order).
            all_gather_p_exec = 22 (handle: Persistent, input: Tensor)
                hook { handle: handle, input: input }
                check |c| {
                    c.persistent("handle", handle)?;
                    c.tensor("input", input)?;
                    c.same_dtype("input", input, handle.output().dtype())?;
                    c.numel_times_size("handle", handle.output(), input.numel())?;
                }
                call {
                    Call::AllGatherP { handle: handle.clone(), input: input.clone() }
                }

            /// all_to_all_v whose split sizes are int64 tensors (one row count per rank) on the
            /// data's device, read when the operation runs, in stream order: no host
            /// synchronisation. `input_split_sizes` says how many rows go to each rank;
            /// `output_split_sizes` receives how many rows came from each rank. Blocks are packed
            /// at the prefix sums of the counts; `output` must hold every row sent to this rank.
            device_alltoallv_single = 23 (
                output: Tensor,
                input: Tensor,
                output_split_sizes: Tensor,
                input_split_sizes: Tensor
            )
                hook {
                    input: input,
                    output: output,
                    input_split_sizes: input_split_sizes,
                    output_split_sizes: output_split_sizes
                }
                check |c| {
                    c.tensor("input", input)?;
                    c.tensor("output", output)?;
                    c.same_dtype("output", output, input.dtype())?;
                    c.same_rows("output", output, input)?;
                    c.counts("input_split_sizes", input_split_sizes)?;
                    c.counts("output_split_sizes", output_split_sizes)?;
                    let all = [input.clone(), output.clone(), input_split_sizes.clone()];
                    c.disjoint("output_split_sizes", std::slice::from_ref(output_split_sizes), "input, output and input_split_sizes", &all)?;
                    c.disjoint("input", std::slice::from_ref(input), "output", std::slice::from_ref(output))?;
                }
                call {
                    Call::AllToAllDynamic {
                        output: output.clone(),
                        input: input.clone(),
                        output_split_sizes: output_split_sizes.clone(),
                        input_split_sizes: input_split_sizes.clone(),
                    }
                }
        }
    };
}

/// Puts each row of the table in the bracketed form [`for_each_op!`](crate::for_each_op) hands to
/// its callback.
#[doc(hidden)]
#[macro_export]
macro_rules! __op_rows {
    ($callback:path; $(
        $(#[doc = $doc:literal])*
        $name:ident = $id:literal ( $($arg:ident : $kind:ident),* $(,)? )
            hook { $($field:ident : $from:ident),* $(,)? }
            check |$c:ident| $check:block
            call $call:block
    )*) => {
        $callback! { $([$name $id [$($doc)*] [$($arg $kind)*] [$($field $from)*] [$c $check] [$call]])* }
    };
}
