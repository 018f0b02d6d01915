//! Faults: a rank dies or stalls mid-operation, and the survivors must fail with an error
//! instead of hanging, then refuse further work.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use torchcomms::{DataType, OpOptions, ReduceOp, Tensor, Work};

use crate::comm_from_env;

fn die_now() -> ! {
    // SAFETY: sending SIGKILL to our own pid has no memory-safety preconditions.
    unsafe {
        libc::kill(libc::getpid(), libc::SIGKILL);
    }
    unreachable!("SIGKILL delivered");
}

/// Runs `op` on survivors and reports the error it ends with; the victim dies mid-way.
pub(crate) fn fault(victim: usize, kind: &str) -> Result<()> {
    let comm = comm_from_env(kind)?;
    let me = comm.get_rank();
    let n = comm.get_size();
    // One good operation first, so the failure happens at a known sequence number.
    let warm = Tensor::from_vec(vec![1.0f32; 8]);
    comm.all_reduce(&warm, ReduceOp::Sum, &OpOptions::sync())?
        .wait()?;
    let big = Tensor::zeros(DataType::F32, 32 << 20 >> 2);
    let start = Instant::now();
    let result = match kind {
        "kill-allreduce" => {
            if me == victim {
                let _w = comm.all_reduce(&big, ReduceOp::Sum, &OpOptions::async_op())?;
                std::thread::sleep(Duration::from_millis(30));
                die_now();
            }
            comm.all_reduce(&big, ReduceOp::Sum, &OpOptions::sync())
                .map(drop)
        }
        "kill-alltoall" => {
            // 32 MiB in n equal blocks.
            let count = (32 << 20 >> 2) / n * n;
            let (inp, out) = (
                Tensor::zeros(DataType::F32, count),
                Tensor::zeros(DataType::F32, count),
            );
            if me == victim {
                let _w = comm.all_to_all_single(&out, &inp, &OpOptions::async_op())?;
                std::thread::sleep(Duration::from_millis(30));
                die_now();
            }
            comm.all_to_all_single(&out, &inp, &OpOptions::sync())
                .map(drop)
        }
        "kill-sendrecv" => {
            // The victim posts receives for a stream of large sends and dies part-way.
            let sender = (victim + 1) % n;
            if me == victim {
                let works: Vec<Work> = (0..64)
                    .map(|_| comm.recv(&big, sender, &OpOptions::async_op()))
                    .collect::<Result<_, _>>()?;
                std::thread::sleep(Duration::from_millis(30));
                drop(works);
                die_now();
            }
            if me != sender {
                println!("BYSTANDER rank {me}");
                return Ok(());
            }
            (0..64).try_for_each(|_| comm.send(&big, victim, &OpOptions::sync()).map(drop))
        }
        "stall" => {
            if me == victim {
                std::thread::sleep(Duration::from_secs(3600));
            }
            comm.all_reduce(&big, ReduceOp::Sum, &OpOptions::sync())
                .map(drop)
        }
        other => bail!("unknown fault scenario {other}"),
    };
    let elapsed = start.elapsed();
    match result {
        Ok(()) => bail!("rank {me}: the operation succeeded although rank {victim} failed"),
        Err(e) => {
            println!("SURVIVOR rank {me} after {} ms: {e}", elapsed.as_millis());
            // The communicator must now refuse work with the same cause.
            let again = comm.barrier(&OpOptions::sync()).and_then(|w| w.wait());
            match again {
                Ok(()) => bail!("rank {me}: the communicator accepted work after failing"),
                Err(e2) => println!("REFUSED rank {me}: {e2}"),
            }
        }
    }
    Ok(())
}
