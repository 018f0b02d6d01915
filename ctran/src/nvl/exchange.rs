//! Direct mode's per-operation exchange: every rank exposes its buffers over CUDA IPC (through
//! the registry's cache) and learns where every peer's are mapped here.

use std::time::Duration;

use super::kernels::MAX_RANKS;
use super::plan;
use super::registry::{Record, Registry, RECORD_BYTES};
use super::{cuda, Nvl};
use crate::error::{Error, Result};
use crate::Op;

impl Nvl {
    /// Direct mode's exchange: every rank's exposed buffers, as (address here, length).
    pub(super) fn exchange(
        &self,
        op: &Op,
        registry: &mut Registry,
        timeout: Duration,
    ) -> Result<Result<Peers>> {
        let rank = self.layout.rank;
        let mine = plan::exposed(op);
        if mine.len() > MAX_RANKS {
            return Err(Error::NotSupported(format!(
                "nvl: {} exposes {} buffers (at most {MAX_RANKS})",
                op.name(),
                mine.len()
            )));
        }
        let mut wire = Vec::with_capacity(8 + MAX_RANKS * RECORD_BYTES);
        let mut records = Vec::new();
        let mut failure = None;
        for s in &mine {
            match registry.expose(s.addr() as u64, s.len()) {
                Ok(r) => records.push(r),
                Err(err) => {
                    failure.get_or_insert(err.to_string());
                    records.push(Record::default());
                }
            }
        }
        wire.extend_from_slice(&(records.len() as u32).to_le_bytes());
        wire.extend_from_slice(&u32::from(failure.is_none()).to_le_bytes());
        for r in &records {
            r.write(&mut wire);
        }
        wire.resize(8 + MAX_RANKS * RECORD_BYTES, 0);
        let all = self.control.all_gather_bytes(&wire, Some(timeout))?;
        let mut out = Vec::with_capacity(self.layout.nranks);
        for (q, w) in all.chunks_exact(wire.len()).enumerate() {
            let count = u32::from_le_bytes(w[0..4].try_into().expect("4")) as usize;
            let ok = u32::from_le_bytes(w[4..8].try_into().expect("4")) == 1;
            if !ok {
                return Err(Error::NotSupported(format!(
                    "{}: rank {q} cannot export its buffers over CUDA IPC{}",
                    op.name(),
                    failure
                        .as_deref()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default()
                )));
            }
            let mut list = Vec::with_capacity(count);
            for i in 0..count.min(MAX_RANKS) {
                let r = Record::read(&w[8 + i * RECORD_BYTES..]);
                let addr = if q == rank {
                    if r.len == 0 {
                        0
                    } else {
                        mine[i].addr() as u64
                    }
                } else {
                    match registry.resolve(q, &r) {
                        Ok(a) => a,
                        Err(err) => return Ok(Err(cuda(op.name(), rank)(err))),
                    }
                };
                list.push((addr, r.len as usize));
            }
            out.push(list);
        }
        Ok(Ok(out))
    }
}

/// Every rank's exposed buffers as (address here, length), by rank.
pub(super) type Peers = Vec<Vec<(u64, usize)>>;
