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

/// Rank 0 disagrees with the others about what the collective is, with buffers of the same size
/// in bytes, so only the operation's description can tell: every rank must fail naming the
/// disagreement instead of returning mixed data. `what`: `redop` (max against sum), `dtype`
/// (i32 against f32), `root` (broadcast from 1 against from 0), `collective` (broadcast
/// against all_reduce) or `order` (a barrier first against an all_reduce first).
pub(crate) fn disagree(what: &str) -> Result<()> {
    let comm = comm_from_env("disagree")?;
    let me = comm.get_rank();
    let odd = me == 0;
    let sync = OpOptions::sync();
    let f32s = Tensor::from_vec(vec![1.0f32 + me as f32; 1024]);
    let start = Instant::now();
    let result = match what {
        "redop" => {
            let op = if odd { ReduceOp::Max } else { ReduceOp::Sum };
            comm.all_reduce(&f32s, op, &sync)
        }
        "dtype" => {
            let t = if odd {
                Tensor::from_vec(vec![1i32; 1024])
            } else {
                f32s.clone()
            };
            comm.all_reduce(&t, ReduceOp::Sum, &sync)
        }
        "root" => comm.broadcast(&f32s, usize::from(odd), &sync),
        "collective" if odd => comm.broadcast(&f32s, 0, &sync),
        "collective" => comm.all_reduce(&f32s, ReduceOp::Sum, &sync),
        "order" => {
            let (first, second): (&dyn Fn() -> _, &dyn Fn() -> _) =
                (&|| comm.barrier(&sync), &|| {
                    comm.all_reduce(&f32s, ReduceOp::Sum, &sync)
                });
            if odd {
                first().and_then(|_| second())
            } else {
                second().and_then(|_| first())
            }
        }
        other => bail!("unknown --what {other}"),
    }
    .and_then(|w| w.wait());
    match result {
        Ok(_) => bail!(
            "rank {me}: ranks that disagree ({what}) succeeded, holding {:?}",
            &f32s.to_vec::<f32>().unwrap_or_default()[..2]
        ),
        Err(e) => println!(
            "DISAGREE rank {me} after {} ms: {e}",
            start.elapsed().as_millis()
        ),
    }
    Ok(())
}

/// The last rank never joins a split: the others' split, given no timeout of its own, must fail
/// within the parent's timeout, not the default one.
pub(crate) fn split_without_a_peer() -> Result<()> {
    let comm = comm_from_env("split-late")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    if me == n - 1 {
        std::thread::sleep(std::time::Duration::from_secs(15));
        println!("SPLIT rank {me} stayed away");
        std::process::exit(0);
    }
    let start = Instant::now();
    let all: Vec<usize> = (0..n).collect();
    match comm.split(&all, "child", None) {
        Ok(_) => bail!("rank {me}: a split without rank {} succeeded", n - 1),
        Err(e) => println!(
            "SPLIT rank {me} after {} ms: {e}",
            start.elapsed().as_millis()
        ),
    }
    Ok(())
}

/// One rank's arguments are refused where another rank's part is only sending: the senders
/// must fail too. `what`: `bcast-size` (the root sends more than the others expect),
/// `a2av-splits` (rank 0 sends two elements where each peer expects one), `gather-list` (the
/// root's output list is one short) or `send-size` (rank 1 expects half of what rank 0 sends).
/// Each rank then runs a barrier; it prints the first error and where it met it (`op` or
/// `next`).
pub(crate) fn lopsided(what: &str) -> Result<()> {
    let comm = comm_from_env("lopsided")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    let sync = OpOptions::sync();
    let floats = |k: usize| Tensor::from_vec(vec![1.0f32; k]);
    let start = Instant::now();
    let op = match what {
        "bcast-size" => comm.broadcast(&floats(if me == 0 { 1024 } else { 512 }), 0, &sync),
        "a2av-splits" => {
            let per_peer = if me == 0 { 2 } else { 1 };
            let input = floats(per_peer * n);
            let output = floats(n);
            let ins = vec![per_peer; n];
            let outs = vec![1; n];
            comm.all_to_all_v_single(&output, &input, &outs, &ins, &sync)
        }
        "gather-list" => {
            let outputs: Vec<Tensor> = if me == 0 {
                (0..n - 1).map(|_| floats(4)).collect()
            } else {
                Vec::new()
            };
            comm.gather(&outputs, &floats(4), 0, &sync)
        }
        "send-size" => match me {
            0 => comm.send(&floats(8), 1, &sync),
            1 => comm.recv(&floats(4), 0, &sync),
            _ => Ok(Work::completed()),
        },
        other => bail!("unknown --what {other}"),
    }
    .and_then(|w| w.wait());
    let (step, result) = match op {
        Err(e) => ("op", Err(e)),
        Ok(()) => ("next", comm.barrier(&sync).and_then(|w| w.wait())),
    };
    match result {
        Ok(()) => bail!("rank {me}: {what} and the barrier after it succeeded"),
        Err(e) => println!(
            "LOPSIDED rank {me} {step} after {} ms: {e}",
            start.elapsed().as_millis()
        ),
    }
    Ok(())
}

/// device_alltoallv_single whose counts are wrong where only the operation can see them (they
/// are read when it runs): `overflow`, rank 0's output holds one row while every peer sends it
/// four; `negative`, rank 0 sends a count of -1. Every rank must fail, naming the cause on rank
/// 0, never hang or write past rank 0's output.
pub(crate) fn dynamic_counts(what: &str) -> Result<()> {
    let comm = comm_from_env("dynamic")?;
    let me = comm.get_rank();
    let n = comm.get_size();
    let sync = OpOptions::sync();
    let rows = |r: usize| {
        if me == 0 && r == 0 && what == "overflow" {
            1
        } else {
            4 * n
        }
    };
    // A guard row after rank 0's one-row output: must keep its value.
    let out_and_guard = Tensor::from_vec(vec![-7.0f32; rows(me) + 1]);
    let out = out_and_guard.narrow(0, rows(me)).with_rows(rows(me));
    let input = Tensor::from_vec(vec![me as f32; 4 * n]).with_rows(4 * n);
    let mut send = vec![4i64; n];
    if me == 0 && what == "negative" {
        send[1] = -1;
    }
    let send = Tensor::from_vec(send);
    let recv = Tensor::from_vec(vec![0i64; n]);
    let start = Instant::now();
    let result = comm
        .device_alltoallv_single(&out, &input, &recv, &send, &sync)
        .and_then(|w| w.wait());
    drop(out);
    let guard = out_and_guard.to_vec::<f32>()?[rows(me)];
    if guard != -7.0 {
        bail!("rank {me}: the row after the output was overwritten ({guard})");
    }
    match result {
        Ok(_) => bail!("rank {me}: device_alltoallv_single with bad counts ({what}) succeeded"),
        Err(e) => println!(
            "DYNAMIC rank {me} after {} ms: {e}",
            start.elapsed().as_millis()
        ),
    }
    Ok(())
}
