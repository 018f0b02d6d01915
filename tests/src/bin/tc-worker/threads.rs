//! Threads taking turns at issuing on one communicator, as PyTorch's autograd thread does after
//! the main thread: the order is the same on every rank, so the work runs, also while the other
//! thread's operations are still in flight.

use anyhow::{bail, Result};
use torchcomms::{OpOptions, ReduceOp, Tensor};

use crate::comm_from_env;

/// A helper thread posts a 4 MiB send around the ring and the matching receive, asynchronously,
/// and ends; the main thread then issues an all_reduce while those are in flight. Every result
/// is checked.
pub(crate) fn threads_taking_turns() -> Result<()> {
    let comm = comm_from_env("threads")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    const LEN: usize = 1 << 20;
    let outgoing = Tensor::from_vec(vec![me as f32; LEN]);
    let landing = Tensor::from_vec(vec![-1.0f32; LEN]);
    let (sent, received) = std::thread::scope(|s| {
        s.spawn(|| -> Result<_> {
            let nowait = OpOptions::async_op();
            let received = comm.recv(&landing, (me + n - 1) % n, &nowait)?;
            let sent = comm.send(&outgoing, (me + 1) % n, &nowait)?;
            Ok((sent, received))
        })
        .join()
        .expect("the issuing thread panicked")
    })?;
    let t = Tensor::from_vec(vec![me as i64 + 1; 1000]);
    comm.all_reduce(&t, ReduceOp::Sum, &OpOptions::sync())?
        .wait()?;
    sent.wait()?;
    received.wait()?;
    let total = (n * (n + 1) / 2) as i64;
    if t.to_vec::<i64>()? != vec![total; 1000] {
        bail!("rank {me}: wrong all_reduce after the other thread's turn");
    }
    let from = ((me + n - 1) % n) as f32;
    if landing.to_vec::<f32>()?.iter().any(|x| *x != from) {
        bail!("rank {me}: the other thread's receive landed wrong data");
    }
    comm.finalize()?;
    println!("THREADS OK rank {me}");
    Ok(())
}
