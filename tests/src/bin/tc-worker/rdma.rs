//! The RDMA transfer API between processes of a job: each rank pairs with one on another host
//! (rank + size/2) and then with one of its own host (rank ^ 1), exchanges URLs and remote
//! buffers through the communicator, writes its pattern into the partner's inbox (with a
//! notification), reads the partner's pattern back, and checks both.

use anyhow::{ensure, Context, Result};
use ctran::rdma::{MemDevice, RdmaMemory, RdmaRemoteBuffer, RdmaTransport};
use torchcomms::{DataType, OpOptions, Tensor, TorchComm};

use crate::comm_from_env;

/// Room for one string of each rank in the exchange.
const SLOT: usize = 1024;

/// Every rank's `s` (at most [`SLOT`] bytes), by all_gather through the communicator.
fn exchange(comm: &TorchComm, s: &str) -> Result<Vec<String>> {
    ensure!(s.len() <= SLOT, "{} bytes do not fit a slot", s.len());
    let mut mine = s.as_bytes().to_vec();
    mine.resize(SLOT, 0);
    let n = comm.get_size();
    let out = Tensor::zeros(DataType::U8, SLOT * n);
    comm.all_gather_single(&out, &Tensor::from_vec(mine), &OpOptions::sync())?
        .wait()?;
    let all = out.to_vec::<u8>()?;
    all.chunks(SLOT)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(SLOT);
            String::from_utf8(c[..end].to_vec()).context("a URL or key that is not UTF-8")
        })
        .collect()
}

fn pattern(rank: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + rank * 31) as u8).collect()
}

fn round(comm: &TorchComm, partner: usize, len: usize) -> Result<String> {
    let me = comm.get_rank();
    let t = RdmaTransport::new(MemDevice::Cpu)?;
    let urls = exchange(comm, &t.bind()?)?;
    t.connect(&urls[partner])?;
    let mut data = pattern(me, len);
    let mut inbox = vec![0u8; len];
    let mut back = vec![0u8; len];
    // SAFETY: the three buffers outlive their registrations (dropped at the end of this
    // function, after the barrier that ends every peer's transfers into them).
    let (data_mem, inbox_mem, back_mem) = unsafe {
        (
            RdmaMemory::register(data.as_mut_ptr() as u64, len as u64, MemDevice::Cpu)?,
            RdmaMemory::register(inbox.as_mut_ptr() as u64, len as u64, MemDevice::Cpu)?,
            RdmaMemory::register(back.as_mut_ptr() as u64, len as u64, MemDevice::Cpu)?,
        )
    };
    let keys = |m: &RdmaMemory| {
        let rb = m.to_remote_buffer();
        format!("{} {} {}", rb.ptr, rb.len, rb.access_key())
    };
    let inboxes = exchange(comm, &keys(&inbox_mem))?;
    let datas = exchange(comm, &keys(&data_mem))?;
    let parse = |s: &str| -> Result<RdmaRemoteBuffer> {
        let mut f = s.split(' ');
        let (p, l, k) = (f.next(), f.next(), f.next());
        let (Some(p), Some(l), Some(k)) = (p, l, k) else {
            anyhow::bail!("malformed remote buffer {s:?}")
        };
        Ok(RdmaRemoteBuffer::new(p.parse()?, l.parse()?, k)?)
    };
    t.write(
        &data_mem.to_view(None, None)?,
        &parse(&inboxes[partner])?,
        true,
        None,
    )?;
    t.wait_for_write(None)?;
    t.read(
        &back_mem.to_mutable_view(None, None)?,
        &parse(&datas[partner])?,
        None,
    )?;
    comm.barrier(&OpOptions::sync())?.wait()?;
    let want = pattern(partner, len);
    ensure!(
        inbox == want,
        "rank {me}: the inbox written by {partner} is wrong"
    );
    ensure!(
        back == want,
        "rank {me}: the data read from {partner} is wrong"
    );
    let s = t.stats();
    drop((data_mem, inbox_mem, back_mem));
    Ok(format!("{s:?}"))
}

pub(crate) fn rdma() -> Result<()> {
    let comm = comm_from_env("rdma")?;
    let (me, n) = (comm.get_rank(), comm.get_size());
    ensure!(
        n >= 2 && n % 2 == 0,
        "rdma needs an even number of ranks, got {n}"
    );
    for (what, partner) in [("across", (me + n / 2) % n), ("beside", me ^ 1)] {
        let stats = round(&comm, partner, (3 << 20) + 5)?;
        println!("RDMA OK rank {me} {what} partner {partner}: {stats}");
    }
    comm.finalize()?;
    Ok(())
}
