//! Point-to-point orders that must complete now that a send finishes only once its receiver
//! accepted it (a synchronous send): the acknowledgement a waiting sender needs may travel
//! behind data its receiver has not asked for yet.

use anyhow::{bail, ensure, Result};
use torchcomms::{OpOptions, Tensor};

use crate::comm_from_env;

/// Pairs ranks (0,1), (2,3), ...; in each pair the lower rank sends and waits before it
/// receives, while the higher one sends first and receives concurrently. Run for a small
/// message and one of 1 MiB, then a blocking ring in alternating order.
pub(crate) fn p2p_order() -> Result<()> {
    let comm = comm_from_env("p2p-order")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    ensure!(
        n % 2 == 0,
        "p2p-order needs an even number of ranks, got {n}"
    );
    let (sync, nowait) = (OpOptions::sync(), OpOptions::async_op());
    for elems in [8usize, 1 << 18] {
        let mine = Tensor::from_vec(vec![me as f32; elems]);
        let got = Tensor::from_vec(vec![-1.0f32; elems]);
        let peer = me ^ 1;
        if me % 2 == 0 {
            comm.send(&mine, peer, &sync)?.wait()?;
            comm.recv(&got, peer, &sync)?.wait()?;
        } else {
            let s = comm.send(&mine, peer, &nowait)?;
            let r = comm.recv(&got, peer, &nowait)?;
            s.wait()?;
            r.wait()?;
        }
        if got.to_vec::<f32>()? != vec![peer as f32; elems] {
            bail!("rank {me}: wrong data from {peer} ({elems} elements)");
        }
    }
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mine = Tensor::from_vec(vec![me as i32; 16]);
    let got = Tensor::from_vec(vec![-1i32; 16]);
    if me % 2 == 0 {
        comm.send(&mine, next, &sync)?.wait()?;
        comm.recv(&got, prev, &sync)?.wait()?;
    } else {
        comm.recv(&got, prev, &sync)?.wait()?;
        comm.send(&mine, next, &sync)?.wait()?;
    }
    if got.to_vec::<i32>()? != vec![prev as i32; 16] {
        bail!("rank {me}: wrong data in the ring from {prev}");
    }
    comm.finalize()?;
    println!("P2P-ORDER OK rank {me}");
    Ok(())
}
