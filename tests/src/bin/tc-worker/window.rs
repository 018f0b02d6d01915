//! One-sided windows through the API: every window call, a ring of put + signal / wait_signal
//! checked each iteration, every rank putting into its own slot of one window at once, and bad
//! input (put past the end, dtype, peer, unregistered, sizes that disagree).

use anyhow::{bail, ensure, Context, Result};
use torchcomms::{DataType, Device, OpOptions, Tensor, WinAccessType};

use crate::comm_from_env;

/// The elements of a registered tensor, read through its bytes (the window shares its owner,
/// so `to_vec` refuses while it is registered).
fn read_i64(t: &Tensor) -> Vec<i64> {
    let mut bytes = vec![0u8; t.nbytes()];
    t.span().copy_to_slice(&mut bytes);
    bytes
        .chunks(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

fn expect_err<T>(r: torchcomms::Result<T>, has: &str, what: &str) -> Result<()> {
    match r {
        Ok(_) => bail!("{what}: succeeded"),
        Err(e) if e.to_string().contains(has) => Ok(()),
        Err(e) => bail!("{what}: error {e} does not say {has:?}"),
    }
}

pub(crate) fn window(iters: usize) -> Result<()> {
    let comm = comm_from_env("window")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    ensure!(n >= 2, "window needs 2 ranks or more");

    // Every call, and the ring.
    let buf = Tensor::zeros(DataType::I64, 32);
    let win = comm.new_window(None)?;
    expect_err(
        win.put(&buf, next, 0, &OpOptions::sync()),
        "tensor_register first",
        "put unregistered",
    )?;
    win.tensor_register(&buf)?;
    ensure!(win.get_size() == 256, "get_size {}", win.get_size());
    ensure!(win.dtype() == Some(DataType::I64) && win.shape() == Some(vec![32]));
    ensure!(win.device() == Some(Device::Cpu));
    ensure!(win.get_attr(me)?.access_type == WinAccessType::Unified);
    ensure!(win.get_attr(next)?.access_type == WinAccessType::Separate);
    ensure!(win.map_remote_tensor(me)?.addr() == buf.addr());
    expect_err(
        win.map_remote_tensor(next),
        "UNIFIED",
        "map_remote_tensor of a peer",
    )?;
    for it in 0..iters as i64 {
        let src = Tensor::from_vec(
            (0..32)
                .map(|i| it * 1000 + me as i64 * 32 + i)
                .collect::<Vec<_>>(),
        );
        let w = win.put(&src, next, 0, &OpOptions::async_op())?;
        win.signal(next, &OpOptions::async_op())?.wait()?;
        w.wait()?;
        win.wait_signal(prev, &OpOptions::sync())?.wait()?;
        let want: Vec<i64> = (0..32).map(|i| it * 1000 + prev as i64 * 32 + i).collect();
        let got = read_i64(&buf);
        ensure!(got == want, "rank {me} iteration {it}: got {:?}", &got[..4]);
        // Our window may be overwritten again once prev heard that we read it.
        win.signal(prev, &OpOptions::sync())?.wait()?;
        win.wait_signal(next, &OpOptions::sync())?.wait()?;
    }

    // Bad input.
    expect_err(
        win.put(
            &Tensor::zeros(DataType::I64, 5),
            next,
            30,
            &OpOptions::sync(),
        ),
        "target_offset_nelems + numel = 35 exceeds the window of 32 elements on rank",
        "put past the end",
    )?;
    expect_err(
        win.put(
            &Tensor::zeros(DataType::F32, 2),
            next,
            0,
            &OpOptions::sync(),
        ),
        "dtype",
        "dtype",
    )?;
    expect_err(
        win.put(&buf, n + 3, 0, &OpOptions::sync()),
        "dst_rank",
        "peer out of range",
    )?;
    expect_err(win.signal(me, &OpOptions::sync()), "peer", "signal to self")?;
    win.tensor_deregister()?;
    expect_err(
        win.put(&buf, next, 0, &OpOptions::sync()),
        "deregistered",
        "put after deregister",
    )?;
    expect_err(
        win.wait_signal(next, &OpOptions::sync()),
        "deregistered",
        "wait after deregister",
    )?;

    // Every rank puts into its own slot of every peer's window at once.
    let slot = 64usize;
    let all = Tensor::zeros(DataType::I64, slot * n);
    let win2 = comm.new_window(Some(&all))?;
    let mine = Tensor::from_vec(
        (0..slot as i64)
            .map(|i| me as i64 * 10_000 + i)
            .collect::<Vec<_>>(),
    );
    let mut works = Vec::new();
    for p in 0..n {
        // A put to this rank is a local copy, in order with the others.
        works.push(win2.put(&mine, p, me * slot, &OpOptions::async_op())?);
        if p != me {
            works.push(win2.signal(p, &OpOptions::async_op())?);
        }
    }
    for w in works {
        w.wait()?;
    }
    for p in (0..n).filter(|&p| p != me) {
        win2.wait_signal(p, &OpOptions::sync())?.wait()?;
    }
    let got = read_i64(&all);
    for p in 0..n {
        let want: Vec<i64> = (0..slot as i64).map(|i| p as i64 * 10_000 + i).collect();
        ensure!(
            got[p * slot..(p + 1) * slot] == want[..],
            "rank {me}: slot of {p} wrong"
        );
    }
    win2.tensor_deregister()?;

    persistent_all_gather(&comm, 200)?;

    // Sizes that disagree: every rank fails, naming the sizes.
    let odd = Tensor::zeros(DataType::I64, 8 + me);
    let e = comm
        .new_window(Some(&odd))
        .err()
        .context("windows of different sizes were accepted")?;
    ensure!(e.to_string().contains("bytes"), "size error says {e}");
    println!("WINDOW SIZES {e}");

    // The communicator is still usable.
    let t = Tensor::from_vec(vec![1i32; 4]);
    comm.all_reduce(
        &t,
        torchcomms::ReduceOp::Sum,
        &torchcomms::OpOptions::sync(),
    )?
    .wait()?;
    ensure!(t.to_vec::<i32>()? == vec![n as i32; 4]);
    comm.finalize()?;
    let cma_puts = ctran::transport::shm::cma_stats().puts;
    println!("WINDOW CMA PUTS {cma_puts}");
    println!("WINDOW OK rank {me}/{n}");
    Ok(())
}

/// A persistent all-gather on a window (asked for by hint on CPU), `rounds` rounds each
/// checked, the input aliasing this rank's block every other round.
fn persistent_all_gather(comm: &torchcomms::TorchComm, rounds: i64) -> Result<()> {
    let (me, n) = (comm.get_rank(), comm.get_size());
    let block = 100usize;
    let out = Tensor::zeros(DataType::I64, block * n);
    let hints = torchcomms::Hints::from([("window".to_string(), "true".to_string())]);
    let h = comm.all_gather_p_init(&out, &hints)?;
    ensure!(
        h.uses_window(),
        "all_gather_p_init with window=true did not make a window"
    );
    for round in 0..rounds {
        let value = |rank: usize| round * 1000 + rank as i64;
        let input = if round % 2 == 0 {
            Tensor::from_vec(vec![value(me); block])
        } else {
            let own = out.narrow(me * block, block);
            own.span()
                .copy_from_slice(&value(me).to_le_bytes().repeat(block));
            own
        };
        comm.all_gather_p_exec(&h, &input, &OpOptions::sync())?
            .wait()?;
        let got = read_i64(&out);
        for r in 0..n {
            ensure!(
                got[r * block..(r + 1) * block]
                    .iter()
                    .all(|&v| v == value(r)),
                "rank {me}: round {round}: block of {r} is {:?}",
                &got[r * block..r * block + 2]
            );
        }
    }
    comm.all_gather_p_free(h)?;
    Ok(())
}
