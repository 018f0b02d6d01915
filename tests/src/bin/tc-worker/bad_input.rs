//! Bad input: arguments the API must refuse, and ranks that disagree about a collective.

use std::time::Instant;

use anyhow::{bail, Result};
use torchcomms::{DataType, Device, OpOptions, P2POp, ReduceOp, Tensor, Work};

use crate::comm_from_env;

/// Bad input: every case must fail with an error naming the argument, and leave the
/// communicator usable.
pub(crate) fn errors() -> Result<()> {
    let comm = comm_from_env("errors")?;
    let n = comm.get_size();
    let me = comm.get_rank();
    let f = Tensor::from_vec(vec![1.0f32; 4]);
    let i = Tensor::from_vec(vec![1i32; 4]);
    let sync = OpOptions::sync();
    // SAFETY: this tensor only ever reaches argument validation, which refuses its device
    // before anything reads the (invalid) address.
    let on_gpu = unsafe { Tensor::from_raw(8 as *mut u8, 1, DataType::F32, Device::Cuda(0)) };
    let mut cases: Vec<(&str, torchcomms::Result<Work>, &str)> = vec![
        (
            "bitwise on float",
            comm.all_reduce(&f, ReduceOp::BXor, &sync),
            "bxor on f32",
        ),
        (
            "root out of range",
            comm.broadcast(&f, n, &sync),
            "root must be in range",
        ),
        (
            "send to self",
            comm.send(&f, me, &sync),
            "no send/recv to self",
        ),
        (
            "peer out of range",
            comm.recv(&f, n + 3, &sync),
            "src must be in range",
        ),
        (
            "non-contiguous",
            comm.all_reduce(&f.clone().with_contiguous(false), ReduceOp::Sum, &sync),
            "contiguous",
        ),
        (
            "wrong dtype in list",
            comm.all_gather(&vec![i.clone(); n], &f, &sync),
            "dtype f32",
        ),
        (
            "list length",
            comm.all_gather(std::slice::from_ref(&f), &f, &sync),
            "one per rank",
        ),
        (
            "size mismatch",
            comm.all_gather_single(&Tensor::zeros(DataType::F32, 3), &f, &sync),
            "elements",
        ),
        (
            "split sizes",
            comm.all_to_all_v_single(&f, &f.clone(), &[1], &[1], &sync),
            "split sizes",
        ),
        (
            "wrong device",
            comm.all_reduce(&on_gpu, ReduceOp::Sum, &sync),
            "cpu",
        ),
        ("empty batch", comm.batch_p2p(&[], &sync), "at least one"),
        (
            "batch to self",
            comm.batch_p2p(
                &[P2POp::Send {
                    tensor: f.clone(),
                    peer: me,
                }],
                &sync,
            ),
            "to self",
        ),
    ];
    let mut bad = Vec::new();
    for (what, res, needle) in cases.drain(..) {
        match res {
            Ok(_) => bad.push(format!("{what}: accepted")),
            Err(e) => {
                let msg = e.to_string();
                if e.kind() != torchcomms::ErrorKind::InvalidArgument || !msg.contains(needle) {
                    bad.push(format!("{what}: unexpected error {msg:?} ({:?})", e.kind()));
                } else {
                    println!("OK {what}: {msg}");
                }
            }
        }
    }
    // Still usable after bad input.
    comm.all_reduce(&f, ReduceOp::Sum, &sync)?.wait()?;
    match comm.split(&[n + 1], "bad", None) {
        Err(e) if e.to_string().contains("ranks") => println!("OK split out of range: {e}"),
        other => bad.push(format!("split out of range: {other:?}")),
    }
    comm.finalize()?;
    match comm.all_reduce(&f, ReduceOp::Sum, &sync) {
        Err(e) if e.to_string().contains("after finalize") => println!("OK op after finalize: {e}"),
        other => bad.push(format!("op after finalize: {other:?}")),
    }
    if !bad.is_empty() {
        bail!("bad-input checks failed:\n{}", bad.join("\n"));
    }
    println!("ERRORS OK rank {me}");
    Ok(())
}

/// Ranks that disagree about the size of a collective (rank 0 passes half of what the others
/// pass) must each fail with an error that names the mismatch, within the timeout, instead of
/// hanging or corrupting memory. `--op` picks the collective, `--size small|mixed|large` the
/// sizes.
pub(crate) fn mismatch(op: &str, size: &str) -> Result<()> {
    let comm = comm_from_env("mismatch")?;
    let me = comm.get_rank();
    let n = comm.get_size();
    // With CTRAN_SHM_CMA_MIN_BYTES=1M (all_reduce switches at 2 MiB) — small: every rank
    // under the cross-memory-attach threshold; large: all over it; mixed: for all_reduce, rank 0
    // under (1.5 MiB) and the others over (3 MiB), so ranks would take different paths.
    let base = match size {
        "large" => 1 << 20,
        "mixed" => 384 << 10,
        _ => 256,
    };
    let count = base * if me == 0 { 1 } else { 2 };
    let sync = OpOptions::sync();
    let t = Tensor::zeros(DataType::F32, count);
    let start = Instant::now();
    let result = match op {
        "all_reduce" => comm.all_reduce(&t, ReduceOp::Sum, &sync),
        "broadcast" => comm.broadcast(&t, 0, &sync),
        "all_gather" => {
            // Every rank believes each block has its own size: rank 0 receives smaller blocks
            // than the others send.
            let outs: Vec<Tensor> = (0..n)
                .map(|_| Tensor::zeros(DataType::F32, count))
                .collect();
            comm.all_gather(&outs, &t, &sync)
        }
        "reduce_scatter" => {
            let ins: Vec<Tensor> = (0..n)
                .map(|_| Tensor::zeros(DataType::F32, count))
                .collect();
            comm.reduce_scatter(&t, &ins, ReduceOp::Sum, &sync)
        }
        other => bail!("unknown --op {other}"),
    }
    .and_then(|w| w.wait());
    match result {
        Ok(_) => bail!("rank {me}: {op} with mismatched sizes succeeded"),
        Err(e) => println!(
            "MISMATCH rank {me} after {} ms: {e}",
            start.elapsed().as_millis()
        ),
    }
    Ok(())
}
