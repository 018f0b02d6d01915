//! The TorchComm API on NCCL: communicator creation through the store, every operation, split.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use torchcomms::{Backend, Call, CommOptions, InitArgs, OpOptions, Result, Tensor, Work};
use torchcomms_core::bootstrap::{env, rendezvous, PrefixStore, Store};
use torchcomms_core::{Device, ReduceOp};
use torchcomms_cuda::RawStream;

use crate::gpu::{Gpu, GpuBuffer};

use crate::comm::{AbortChannel, Shared};
use crate::enqueue::{invalid, ptr, Enq};
use crate::error::NcclError;
use crate::sys::{self, ncclComm_t, ncclUniqueId, Nccl, Vendor};
use crate::work::{KeepAlive, NcclWork, Pending, Watchdog};

/// A communicator of the `nccl` backend.
#[derive(Debug)]
pub struct NcclBackend {
    pub(crate) shared: Arc<Shared>,
    device: Device,
    /// Keeps the `MASTER_ADDR` store (and rank 0's server) while the communicator lives, when
    /// the store came from the environment.
    _boot: Option<rendezvous::BootstrapStore>,
    /// One i32 on the device: what a barrier all-reduces.
    pub(crate) barrier_buf: Arc<GpuBuffer>,
    watchdog: Watchdog,
    finalized: AtomicBool,
}

/// How many communicators of each name this process created: all ranks create them in the
/// same order, so `(name, count)` names the same communicator on every rank.
fn generation(name: &str) -> u64 {
    static GEN: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    let mut m = GEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let g = m.entry(name.to_string()).or_insert(0);
    *g += 1;
    *g
}

impl NcclBackend {
    /// Creates the communicator (a collective over all ranks): rank and size from the options
    /// or the launcher, the NCCL unique id from rank 0 through the store.
    pub fn create(args: &InitArgs) -> Result<Box<dyn Backend>> {
        Ok(Box::new(Self::create_inner(args, Vendor::Nccl)?))
    }

    /// The `rccl` backend: the same code on AMD's RCCL. ROCm builds of PyTorch show AMD GPUs as
    /// `cuda` devices, so the device is `cuda:N` here too.
    pub fn create_rccl(args: &InitArgs) -> Result<Box<dyn Backend>> {
        Ok(Box::new(Self::create_inner(args, Vendor::Rccl)?))
    }

    fn create_inner(args: &InitArgs, vendor: Vendor) -> Result<NcclBackend, NcclError> {
        let Device::Cuda(ordinal) = args.device else {
            let on = match vendor {
                Vendor::Nccl => "the nccl backend runs on CUDA devices",
                Vendor::Rccl => {
                    "the rccl backend runs on AMD GPUs, `cuda` devices to ROCm's PyTorch"
                }
            };
            return Err(NcclError::NotSupported(format!(
                "device {} ({on}: device=cuda:N)",
                args.device
            )));
        };
        let nccl = sys::library(vendor)?;
        let o = &args.options;
        let (rank, size) = match (o.rank, o.size) {
            (Some(r), Some(s)) => (r, s),
            _ => {
                let info = env::discover()
                    .map_err(|source| NcclError::Bootstrap {
                        comm: args.name.clone(),
                        rank: 0,
                        source: Box::new(source),
                    })?
                    .ok_or_else(|| {
                        invalid(
                            "rank/size",
                            "a launcher environment (TORCHCOMM_RANK/SIZE, RANK/WORLD_SIZE, OMPI_*, PMI_*, SLURM_*) or explicit rank and size",
                            "none found",
                        )
                    })?;
                (o.rank.unwrap_or(info.rank), o.size.unwrap_or(info.size))
            }
        };
        let boot_err = |source| NcclError::Bootstrap {
            comm: args.name.clone(),
            rank,
            source: Box::new(source),
        };
        let (store, boot): (Arc<dyn Store>, _) = match &o.store {
            Some(s) => (Arc::clone(s), None),
            None => {
                let b = rendezvous::store_from_env(rank, size, o.timeout).map_err(boot_err)?;
                (Arc::clone(b.store()), Some(b))
            }
        };
        let prefix = format!("torchcomms_nccl/{}/{}", args.name, generation(&args.name));
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(prefix, store));
        let gpu = Gpu::open(vendor, ordinal).map_err(|source| NcclError::Gpu {
            op: format!("opening device {ordinal} for {}", vendor.backend_name()),
            rank,
            comm: args.name.clone(),
            source: Box::new(source),
        })?;
        let id = exchange_unique_id(nccl, &*store, rank, size, o.timeout).map_err(boot_err)?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` receives the new communicator; the device is bound on this thread.
        let rc = unsafe { (nccl.comm_init_rank)(&mut raw, size as c_int, id, rank as c_int) };
        if rc != sys::NCCL_SUCCESS {
            return Err(NcclError::Call {
                call: "ncclCommInitRank",
                rank,
                comm: args.name.clone(),
                message: nccl.describe(rc, std::ptr::null_mut()),
            });
        }
        let channel = AbortChannel {
            store,
            key: "abort".into(),
        };
        Self::assemble(
            nccl,
            raw,
            rank,
            size,
            &args.name,
            args.device,
            gpu,
            o,
            Some(channel),
            boot,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        nccl: &'static Nccl,
        raw: ncclComm_t,
        rank: usize,
        size: usize,
        name: &str,
        device: Device,
        gpu: Gpu,
        o: &CommOptions,
        channel: Option<AbortChannel>,
        boot: Option<rendezvous::BootstrapStore>,
    ) -> Result<NcclBackend, NcclError> {
        let shared = Shared::new(
            nccl,
            raw,
            rank,
            size,
            name.into(),
            gpu,
            o.high_priority_stream,
            channel,
            o.timeout,
            o.abort_process_on_timeout_or_error,
        )
        .inspect_err(|_| {
            // SAFETY: the communicator was just created and nothing else holds it.
            unsafe { (nccl.comm_destroy)(raw) };
        })?;
        let shared = Arc::new(shared);
        let barrier_buf = shared
            .gpu
            .zeroed(4)
            .map_err(|e| shared.gpu_err("allocating the barrier buffer", e))?;
        let watchdog = Watchdog::start(Arc::clone(&shared))?;
        Ok(NcclBackend {
            shared,
            device,
            _boot: boot,
            barrier_buf: Arc::new(barrier_buf),
            watchdog,
            finalized: AtomicBool::new(false),
        })
    }

    /// Issues one operation: orders our stream after the caller's, enqueues `body`, records
    /// the completion event, hands the buffers to the watchdog, returns the work.
    pub(crate) fn launch(
        &self,
        op: &'static str,
        opts: &OpOptions,
        keep: KeepAlive,
        blocking: bool,
        body: impl FnOnce(&mut Enq<'_>) -> Result<(), NcclError>,
    ) -> Result<Work> {
        let s = &self.shared;
        let timeout = opts.timeout_or(s.timeout);
        let caller = RawStream(opts.stream.unwrap_or(0));
        let (event, keep) = {
            let (_guard, comm) = s.begin(op)?;
            s.follow(op, caller)?;
            let mut enq = Enq {
                s,
                comm,
                stream: s.stream.raw().0 as usize as *mut c_void,
                keep,
            };
            body(&mut enq)?;
            let event = s
                .gpu
                .event()
                .and_then(|e| e.record(s.stream.raw()).map(|()| e))
                .map_err(|e| s.gpu_err(op, e))?;
            (Arc::new(event), enq.keep)
        };
        let seq = s.next_seq();
        let capturing = s.gpu.is_capturing(caller).unwrap_or(false);
        if capturing {
            // TODO(issue 7, graphs): captured work completes at replay; the caller keeps the
            // tensors of a graph alive, as with PyTorch.
            drop(keep);
        } else {
            self.watchdog.track(Pending {
                event: Arc::clone(&event),
                keep,
                issued: Instant::now(),
                timeout,
                op,
                seq,
            });
        }
        let work = Work::new(
            Box::new(NcclWork {
                shared: Arc::clone(s),
                event,
                caller,
                op,
                blocking,
                issued: Instant::now(),
                captured: capturing,
            }),
            timeout,
        );
        if !opts.async_op {
            work.wait()?;
        }
        Ok(work)
    }

    pub(crate) fn bitwise_all_reduce(
        &self,
        e: &mut Enq<'_>,
        t: &Tensor,
        op: ReduceOp,
        root: Option<usize>,
    ) -> Result<(), NcclError> {
        let (n, dt, size) = (t.numel(), t.dtype(), self.shared.size);
        let bytes = t.nbytes();
        let tmp = e.scratch(bytes * size)?;
        e.all_gather_raw(ptr(t), tmp as *mut c_void, n, dt)?;
        if root.is_none_or(|r| r == self.shared.rank) {
            let blocks: Vec<u64> = (0..size).map(|r| tmp + (r * bytes) as u64).collect();
            e.combine_blocks(dt, op, t.addr() as u64, &blocks, n)?;
        }
        Ok(())
    }
}

/// Rank 0 makes the unique id and publishes it; the others read it. Then every rank checks in,
/// so a missing rank fails here within the timeout instead of hanging in ncclCommInitRank.
fn exchange_unique_id(
    nccl: &Nccl,
    store: &dyn Store,
    rank: usize,
    size: usize,
    timeout: Duration,
) -> torchcomms_core::Result<ncclUniqueId> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    if rank == 0 {
        // SAFETY: writes 128 bytes.
        let rc = unsafe { (nccl.get_unique_id)(&mut id) };
        if rc != sys::NCCL_SUCCESS {
            return Err(torchcomms_core::Error::Bootstrap {
                comm: String::new(),
                reason: format!(
                    "ncclGetUniqueId: {}",
                    nccl.describe(rc, std::ptr::null_mut())
                ),
            });
        }
        store.set("uid", &id.internal)?;
    } else {
        let v = store.get("uid", timeout)?;
        if v.len() != 128 {
            return Err(torchcomms_core::Error::Bootstrap {
                comm: String::new(),
                reason: format!("the unique id in the store has {} bytes, not 128", v.len()),
            });
        }
        id.internal.copy_from_slice(&v);
    }
    store.set(&format!("joined/{rank}"), b"1")?;
    let keys: Vec<String> = (0..size).map(|r| format!("joined/{r}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    store.wait(&refs, timeout)?;
    Ok(id)
}

impl Backend for NcclBackend {
    fn backend_name(&self) -> &str {
        "nccl"
    }
    fn version(&self) -> Result<String> {
        Ok(format!("NCCL {}", self.shared.nccl.version_string()))
    }
    fn rank(&self) -> usize {
        self.shared.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn comm_name(&self) -> &str {
        &self.shared.name
    }
    fn device(&self) -> Device {
        self.device
    }

    fn run(&self, call: Call, opts: &OpOptions) -> Result<Work> {
        match call {
            Call::AllReduce { tensor, op } => self.all_reduce(&tensor, op, opts),
            Call::Reduce { tensor, root, op } => self.reduce(&tensor, root, op, opts),
            Call::Broadcast { tensor, root } => self.broadcast(&tensor, root, opts),
            Call::AllGather { outputs, input } => self.all_gather(&outputs, &input, opts),
            Call::ReduceScatter { output, inputs, op } => {
                self.reduce_scatter(&output, &inputs, op, opts)
            }
            Call::AllToAll {
                outputs, inputs, ..
            } => self.all_to_all(&outputs, &inputs, opts),
            Call::Scatter {
                output,
                inputs,
                root,
            } => self.scatter(&output, &inputs, root, opts),
            Call::Gather {
                outputs,
                input,
                root,
            } => self.gather(&outputs, &input, root, opts),
            Call::Barrier => self.barrier(opts),
            Call::Send { tensor, peer } => self.send(&tensor, peer, opts),
            Call::Recv { tensor, peer } => self.recv(&tensor, peer, opts),
            Call::Batch { ops } => self.batch_p2p(&ops, opts),
            other => Err(torchcomms::Error::NotImplemented {
                what: other.name().into(),
                comm: self.shared.name.clone(),
            }),
        }
    }

    fn split(
        &self,
        ranks: &[usize],
        name: &str,
        options: CommOptions,
    ) -> Result<Option<Box<dyn Backend>>> {
        let s = &self.shared;
        let split = s.nccl.comm_split.ok_or_else(|| {
            NcclError::NotSupported(format!(
                "split: NCCL {} lacks ncclCommSplit (2.18+)",
                s.nccl.version_string()
            ))
        })?;
        let me = ranks.iter().position(|&r| r == s.rank);
        // Every rank of one group passes the same list, so the list names the group.
        let color = me.map_or(sys::NCCL_SPLIT_NOCOLOR, |_| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &r in ranks {
                h = (h ^ r as u64).wrapping_mul(0x100_0000_01b3);
            }
            (h % (i32::MAX as u64)) as c_int
        });
        let key = me.unwrap_or(0) as c_int;
        let mut child: ncclComm_t = std::ptr::null_mut();
        {
            let (_g, comm) = s.begin("split")?;
            // SAFETY: collective over the parent; NULL config inherits the parent's.
            let rc = unsafe { split(comm, color, key, &mut child, std::ptr::null_mut()) };
            s.check("ncclCommSplit", rc)?;
        }
        let Some(new_rank) = me else {
            return Ok(None);
        };
        if child.is_null() {
            return Err(NcclError::Call {
                call: "ncclCommSplit",
                rank: s.rank,
                comm: name.into(),
                message: "returned no communicator for a member".into(),
            }
            .into());
        }
        let channel = s.abort_channel.as_ref().map(|c| AbortChannel {
            store: Arc::new(PrefixStore::new(
                format!(
                    "split/{name}/{color}/{}",
                    generation(&format!("{}/{name}", s.name))
                ),
                Arc::clone(&c.store),
            )),
            key: "abort".into(),
        });
        let b = Self::assemble(
            s.nccl,
            child,
            new_rank,
            ranks.len(),
            name,
            self.device,
            s.gpu.clone(),
            &options,
            channel,
            None,
        )?;
        Ok(Some(Box::new(b)))
    }

    fn finalize(&self) -> Result<()> {
        if self.finalized.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Some(e) = self.shared.failure() {
            return Err(e.into());
        }
        // Wait for outstanding work, then release NCCL's resources.
        let w = self.barrier(&OpOptions::sync())?;
        w.wait_blocking()?;
        self.shared.destroy()?;
        Ok(())
    }

    fn supports_abort(&self) -> bool {
        true
    }

    fn abort(&self) -> Result<()> {
        self.shared.abort_by_user();
        Ok(())
    }

    fn is_aborted(&self) -> bool {
        // Every failure aborts the NCCL communicator (ncclCommAbort).
        self.shared.failure().is_some()
    }
}

impl NcclBackend {
    /// The communicator's stream (operations run there), as a `CUstream` integer.
    pub fn stream(&self) -> u64 {
        self.shared.stream.raw().0
    }

    /// True when the communicator's stream was created with the greatest priority.
    pub fn high_priority_stream(&self) -> bool {
        self.shared.high_priority
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_count_per_name() {
        let a = generation("gen-test-a");
        assert_eq!(generation("gen-test-a"), a + 1);
        assert_eq!(generation("gen-test-b"), 1);
    }
}
