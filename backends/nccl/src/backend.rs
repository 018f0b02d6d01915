//! The TorchComm API on NCCL: communicator creation through the store, every operation, split.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ctran::bootstrap::{env, rendezvous, PrefixStore, Store};
use ctran::cuda::{self, Context, DeviceBuffer, Event, RawStream, ReduceKernels};
use ctran::{DataType, Device, ReduceOp};
use torchcomms::{Backend, CommOptions, InitArgs, OpOptions, P2POp, Result, Tensor, Work};

use crate::comm::{AbortChannel, Shared};
use crate::error::NcclError;
use crate::sys::{self, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId, Nccl};
use crate::work::{KeepAlive, NcclWork, Pending, Watchdog};

/// A communicator of the `nccl` backend.
#[derive(Debug)]
pub struct NcclBackend {
    shared: Arc<Shared>,
    device: Device,
    /// Keeps the `MASTER_ADDR` store (and rank 0's server) while the communicator lives, when
    /// the store came from the environment.
    _boot: Option<rendezvous::BootstrapStore>,
    /// One i32 on the device: what a barrier all-reduces.
    barrier_buf: Arc<DeviceBuffer>,
    watchdog: Watchdog,
    finalized: AtomicBool,
}

fn invalid(arg: &str, expected: &str, got: impl ToString) -> NcclError {
    NcclError::InvalidArgument {
        arg: arg.into(),
        expected: expected.into(),
        got: got.to_string(),
    }
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

/// The NCCL type of a dtype (bool travels as uint8).
fn nccl_dtype(d: DataType) -> Result<ncclDataType_t, NcclError> {
    Ok(match d {
        DataType::I8 => sys::NCCL_INT8,
        DataType::U8 | DataType::Bool => sys::NCCL_UINT8,
        DataType::I32 => sys::NCCL_INT32,
        DataType::I64 => sys::NCCL_INT64,
        DataType::F16 => sys::NCCL_FLOAT16,
        DataType::F32 => sys::NCCL_FLOAT32,
        DataType::F64 => sys::NCCL_FLOAT64,
        DataType::BF16 => sys::NCCL_BFLOAT16,
        other => return Err(NcclError::NotSupported(format!("dtype {other}"))),
    })
}

/// How a (dtype, op) pair runs.
#[derive(Debug, Clone, Copy)]
enum Red {
    /// A built-in NCCL operator.
    Native(ncclRedOp_t),
    /// `ncclRedOpCreatePreMulSum` with this factor.
    PreMul(f64),
    /// NCCL has no such operator (bitwise ops, xor on bool): gather every contribution and
    /// combine them with ctran's kernels.
    Kernel,
}

fn red(dtype: DataType, op: ReduceOp) -> Result<Red, NcclError> {
    op.check_dtype(dtype)
        .map_err(|e| invalid("op", "a reduce op that applies to the dtype", e))?;
    let bool_ = dtype == DataType::Bool;
    Ok(match op {
        // On 0/1 bytes: or is max, and is min.
        ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr if bool_ => Red::Native(sys::NCCL_MAX),
        ReduceOp::Product | ReduceOp::Min | ReduceOp::BAnd if bool_ => Red::Native(sys::NCCL_MIN),
        ReduceOp::Avg | ReduceOp::PremulSum { .. } if bool_ => {
            return Err(invalid(
                "op",
                "sum, prod, min, max, band, bor or bxor on bool",
                op,
            ))
        }
        ReduceOp::Sum => Red::Native(sys::NCCL_SUM),
        ReduceOp::Product => Red::Native(sys::NCCL_PROD),
        ReduceOp::Min => Red::Native(sys::NCCL_MIN),
        ReduceOp::Max => Red::Native(sys::NCCL_MAX),
        ReduceOp::Avg => Red::Native(sys::NCCL_AVG),
        ReduceOp::PremulSum { factor } => Red::PreMul(factor),
        ReduceOp::BAnd | ReduceOp::BOr | ReduceOp::BXor => Red::Kernel,
        other => return Err(NcclError::NotSupported(format!("reduce op {other}"))),
    })
}

/// The PREMUL_SUM scalar in the element type, as NCCL reads it from the host.
fn premul_scalar(dtype: DataType, factor: f64) -> [u8; 8] {
    let mut b = [0u8; 8];
    match dtype {
        DataType::F16 => b[..2].copy_from_slice(&half::f16::from_f64(factor).to_le_bytes()),
        DataType::BF16 => b[..2].copy_from_slice(&half::bf16::from_f64(factor).to_le_bytes()),
        DataType::F32 => b[..4].copy_from_slice(&(factor as f32).to_le_bytes()),
        DataType::F64 => b.copy_from_slice(&factor.to_le_bytes()),
        DataType::I8 => b[0] = factor as i8 as u8,
        DataType::U8 | DataType::Bool => b[0] = factor as u8,
        DataType::I32 => b[..4].copy_from_slice(&(factor as i32).to_le_bytes()),
        _ => b.copy_from_slice(&(factor as i64).to_le_bytes()),
    }
    b
}

fn ptr(t: &Tensor) -> *mut c_void {
    t.addr() as *mut c_void
}

fn owners<'a>(ts: impl IntoIterator<Item = &'a Tensor>) -> KeepAlive {
    ts.into_iter().filter_map(|t| t.owner().cloned()).collect()
}

/// True when `ts` are equal-sized blocks laid out back to back.
fn adjacent(ts: &[Tensor]) -> bool {
    let Some(first) = ts.first() else {
        return true;
    };
    ts.iter()
        .enumerate()
        .all(|(i, t)| t.numel() == first.numel() && t.addr() == first.addr() + i * first.nbytes())
}

/// Enqueues NCCL calls on the communicator's stream (under the enqueue lock).
struct Enq<'a> {
    s: &'a Shared,
    comm: ncclComm_t,
    stream: *mut c_void,
    keep: KeepAlive,
}

impl Enq<'_> {
    fn nccl(&self) -> &'static Nccl {
        self.s.nccl
    }

    fn group<R>(&self, body: impl FnOnce(&Self) -> Result<R, NcclError>) -> Result<R, NcclError> {
        // SAFETY: group calls take no arguments.
        let rc = unsafe { (self.nccl().group_start)() };
        self.s.check("ncclGroupStart", rc)?;
        let r = body(self);
        // SAFETY: as above; always closes the group opened above.
        let rc = unsafe { (self.nccl().group_end)() };
        let end = self.s.check("ncclGroupEnd", rc);
        let r = r?;
        end?;
        Ok(r)
    }

    /// Runs `f` with the NCCL operator for `red`, creating and destroying a PREMUL_SUM one.
    fn with_op(
        &self,
        dtype: DataType,
        red: Red,
        f: impl FnOnce(ncclRedOp_t) -> Result<(), NcclError>,
    ) -> Result<(), NcclError> {
        match red {
            Red::Native(op) => f(op),
            Red::PreMul(factor) => {
                let mut scalar = premul_scalar(dtype, factor);
                let mut op: ncclRedOp_t = 0;
                // SAFETY: the scalar is read during the call (host immediate); the comm is live.
                let rc = unsafe {
                    (self.nccl().red_op_create_pre_mul_sum)(
                        &mut op,
                        scalar.as_mut_ptr().cast(),
                        nccl_dtype(dtype)?,
                        sys::NCCL_SCALAR_HOST_IMMEDIATE,
                        self.comm,
                    )
                };
                self.s.check("ncclRedOpCreatePreMulSum", rc)?;
                let r = f(op);
                // SAFETY: NCCL allows destroying an operator once the calls using it returned.
                let rc = unsafe { (self.nccl().red_op_destroy)(op, self.comm) };
                r.and(self.s.check("ncclRedOpDestroy", rc))
            }
            Red::Kernel => Err(NcclError::NotSupported("kernel reductions here".into())),
        }
    }

    fn all_reduce(&self, buf: &Tensor, op: ncclRedOp_t) -> Result<(), NcclError> {
        // SAFETY: `buf` is device memory of this comm's device holding numel elements, kept
        // alive by the watchdog until the operation completes.
        let rc = unsafe {
            (self.nccl().all_reduce)(
                ptr(buf),
                ptr(buf),
                buf.numel(),
                nccl_dtype(buf.dtype())?,
                op,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclAllReduce", rc)
    }

    fn all_gather_raw(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: DataType,
    ) -> Result<(), NcclError> {
        // SAFETY: as for all_reduce; recv holds size * count elements.
        let rc = unsafe {
            (self.nccl().all_gather)(send, recv, count, nccl_dtype(dt)?, self.comm, self.stream)
        };
        self.s.check("ncclAllGather", rc)
    }

    fn broadcast(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: DataType,
        root: usize,
    ) -> Result<(), NcclError> {
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().broadcast)(
                send,
                recv,
                count,
                nccl_dtype(dt)?,
                root as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclBroadcast", rc)
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: DataType,
        op: ncclRedOp_t,
        root: usize,
    ) -> Result<(), NcclError> {
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().reduce)(
                send,
                recv,
                count,
                nccl_dtype(dt)?,
                op,
                root as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclReduce", rc)
    }

    fn send_raw(&self, p: u64, count: usize, dt: DataType, peer: usize) -> Result<(), NcclError> {
        if count == 0 {
            return Ok(());
        }
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().send)(
                p as *const c_void,
                count,
                nccl_dtype(dt)?,
                peer as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclSend", rc)
    }

    fn recv_raw(&self, p: u64, count: usize, dt: DataType, peer: usize) -> Result<(), NcclError> {
        if count == 0 {
            return Ok(());
        }
        // SAFETY: as for all_reduce.
        let rc = unsafe {
            (self.nccl().recv)(
                p as *mut c_void,
                count,
                nccl_dtype(dt)?,
                peer as c_int,
                self.comm,
                self.stream,
            )
        };
        self.s.check("ncclRecv", rc)
    }

    fn send(&self, t: &Tensor, peer: usize) -> Result<(), NcclError> {
        self.send_raw(t.addr() as u64, t.numel(), t.dtype(), peer)
    }

    fn recv(&self, t: &Tensor, peer: usize) -> Result<(), NcclError> {
        self.recv_raw(t.addr() as u64, t.numel(), t.dtype(), peer)
    }

    /// A scratch buffer kept alive until the operation completes.
    fn scratch(&mut self, bytes: usize) -> Result<u64, NcclError> {
        let b = DeviceBuffer::alloc(&self.s.ctx, bytes)
            .map_err(|e| self.s.cuda("allocating scratch memory", e))?;
        let p = b.as_ptr();
        self.keep.push(Arc::new(b));
        Ok(p)
    }

    fn kernels(&self) -> Result<Arc<ReduceKernels>, NcclError> {
        ReduceKernels::get(&self.s.ctx).map_err(|e| self.s.cuda("loading the reduction kernels", e))
    }

    /// `dst = c[0] ⊕ c[1] ⊕ ...` over `n` elements with ctran's kernels, on our stream.
    fn combine_blocks(
        &self,
        dtype: DataType,
        op: ReduceOp,
        dst: u64,
        blocks: &[u64],
        n: usize,
    ) -> Result<(), NcclError> {
        let k = self.kernels()?;
        let st = RawStream(self.stream as u64);
        let cuda = |e| self.s.cuda("combine", e);
        match blocks {
            [] => Ok(()),
            [only] => {
                // SAFETY: scratch and tensors are alive until the op completes (keep/owners).
                unsafe { cuda::copy_async(dst, *only, n * dtype.size_bytes(), st) }.map_err(cuda)
            }
            [a, b, rest @ ..] => {
                // SAFETY: as above; every block holds n elements.
                unsafe { k.combine(dtype, op, dst, *a, *b, n, st) }.map_err(cuda)?;
                for c in rest {
                    // SAFETY: as above.
                    unsafe { k.combine(dtype, op, dst, dst, *c, n, st) }.map_err(cuda)?;
                }
                Ok(())
            }
        }
    }
}

impl NcclBackend {
    /// Creates the communicator (a collective over all ranks): rank and size from the options
    /// or the launcher, the NCCL unique id from rank 0 through the store.
    pub fn create(args: &InitArgs) -> Result<Box<dyn Backend>> {
        Ok(Box::new(Self::create_inner(args)?))
    }

    fn create_inner(args: &InitArgs) -> Result<NcclBackend, NcclError> {
        let Device::Cuda(ordinal) = args.device else {
            return Err(NcclError::NotSupported(format!(
                "device {} (the nccl backend runs on CUDA devices: device=cuda:N)",
                args.device
            )));
        };
        let nccl = sys::nccl()?;
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
        let ctx = Context::get(ordinal).map_err(|source| NcclError::Cuda {
            op: "opening the device".into(),
            rank,
            comm: args.name.clone(),
            source: Box::new(source),
        })?;
        ctx.bind().map_err(|source| NcclError::Cuda {
            op: "binding the device".into(),
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
            ctx,
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
        ctx: Arc<Context>,
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
            Arc::clone(&ctx),
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
        let barrier_buf = DeviceBuffer::zeroed(&ctx, 4)
            .map_err(|e| shared.cuda("allocating the barrier buffer", e))?;
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
    fn launch(
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
                stream: s.stream.as_raw().0 as usize as *mut c_void,
                keep,
            };
            body(&mut enq)?;
            let event = Event::new(&s.ctx)
                .and_then(|e| e.record(s.stream.as_raw()).map(|()| e))
                .map_err(|e| s.cuda(op, e))?;
            (Arc::new(event), enq.keep)
        };
        let seq = s.next_seq();
        let capturing = caller.is_capturing().unwrap_or(false);
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

    fn bitwise_all_reduce(
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
) -> ctran::Result<ncclUniqueId> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    if rank == 0 {
        // SAFETY: writes 128 bytes.
        let rc = unsafe { (nccl.get_unique_id)(&mut id) };
        if rc != sys::NCCL_SUCCESS {
            return Err(ctran::Error::Bootstrap {
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
            return Err(ctran::Error::Bootstrap {
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

    fn all_reduce(&self, t: &Tensor, op: ReduceOp, opts: &OpOptions) -> Result<Work> {
        let r = red(t.dtype(), op)?;
        self.launch("all_reduce", opts, owners([t]), false, |e| match r {
            Red::Kernel => self.bitwise_all_reduce(e, t, op, None),
            _ => e.with_op(t.dtype(), r, |o| e.all_reduce(t, o)),
        })
    }

    fn reduce(&self, t: &Tensor, root: usize, op: ReduceOp, opts: &OpOptions) -> Result<Work> {
        let r = red(t.dtype(), op)?;
        self.launch("reduce", opts, owners([t]), false, |e| match r {
            Red::Kernel => self.bitwise_all_reduce(e, t, op, Some(root)),
            _ => e.with_op(t.dtype(), r, |o| {
                e.reduce(ptr(t), ptr(t), t.numel(), t.dtype(), o, root)
            }),
        })
    }

    fn broadcast(&self, t: &Tensor, root: usize, opts: &OpOptions) -> Result<Work> {
        self.launch("broadcast", opts, owners([t]), false, |e| {
            e.broadcast(ptr(t), ptr(t), t.numel(), t.dtype(), root)
        })
    }

    fn all_gather(&self, outputs: &[Tensor], input: &Tensor, opts: &OpOptions) -> Result<Work> {
        let keep = owners(outputs.iter().chain([input]));
        let uniform = adjacent(outputs) && outputs.iter().all(|o| o.numel() == input.numel());
        self.launch("all_gather", opts, keep, false, |e| {
            if uniform && !outputs.is_empty() {
                return e.all_gather_raw(
                    ptr(input),
                    ptr(&outputs[0]),
                    input.numel(),
                    input.dtype(),
                );
            }
            // all_gather_v: one broadcast per rank, grouped.
            let me = self.shared.rank;
            e.group(|e| {
                for (r, out) in outputs.iter().enumerate() {
                    let send = if r == me { ptr(input) } else { ptr(out) };
                    e.broadcast(send, ptr(out), out.numel(), out.dtype(), r)?;
                }
                Ok(())
            })
        })
    }

    fn reduce_scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        op: ReduceOp,
        opts: &OpOptions,
    ) -> Result<Work> {
        let r = red(output.dtype(), op)?;
        let keep = owners(inputs.iter().chain([output]));
        let uniform = adjacent(inputs) && inputs.iter().all(|i| i.numel() == output.numel());
        let me = self.shared.rank;
        let dt = output.dtype();
        self.launch("reduce_scatter", opts, keep, false, |e| match r {
            Red::Kernel => {
                // Every rank's block for us lands in scratch, then the kernels combine them.
                let n = output.numel();
                let bytes = output.nbytes();
                let tmp = e.scratch(bytes * self.shared.size)?;
                e.group(|e| {
                    for (p, inp) in inputs.iter().enumerate() {
                        e.send(inp, p)?;
                        e.recv_raw(tmp + (p * bytes) as u64, n, dt, p)?;
                    }
                    Ok(())
                })?;
                let blocks: Vec<u64> = (0..self.shared.size)
                    .map(|p| tmp + (p * bytes) as u64)
                    .collect();
                e.combine_blocks(dt, op, output.addr() as u64, &blocks, n)
            }
            _ if uniform && !inputs.is_empty() => e.with_op(dt, r, |o| {
                // SAFETY: inputs are size blocks of output.numel() elements, back to back.
                let rc = unsafe {
                    (e.nccl().reduce_scatter)(
                        ptr(&inputs[0]),
                        ptr(output),
                        output.numel(),
                        nccl_dtype(dt)?,
                        o,
                        e.comm,
                        e.stream,
                    )
                };
                e.s.check("ncclReduceScatter", rc)
            }),
            // reduce_scatter_v: one reduce per rank, grouped.
            _ => e.with_op(dt, r, |o| {
                e.group(|e| {
                    for (p, inp) in inputs.iter().enumerate() {
                        let recv = if p == me { ptr(output) } else { ptr(inp) };
                        e.reduce(ptr(inp), recv, inp.numel(), dt, o, p)?;
                    }
                    Ok(())
                })
            }),
        })
    }

    fn all_to_all(&self, outputs: &[Tensor], inputs: &[Tensor], opts: &OpOptions) -> Result<Work> {
        let keep = owners(inputs.iter().chain(outputs));
        self.launch("all_to_all", opts, keep, false, |e| {
            e.group(|e| {
                for (p, (out, inp)) in outputs.iter().zip(inputs).enumerate() {
                    e.send(inp, p)?;
                    e.recv(out, p)?;
                }
                Ok(())
            })
        })
    }

    fn scatter(
        &self,
        output: &Tensor,
        inputs: &[Tensor],
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let keep = owners(inputs.iter().chain([output]));
        let me = self.shared.rank;
        self.launch("scatter", opts, keep, false, |e| {
            e.group(|e| {
                if me == root {
                    for (p, inp) in inputs.iter().enumerate() {
                        e.send(inp, p)?;
                    }
                }
                e.recv(output, root)
            })
        })
    }

    fn gather(
        &self,
        outputs: &[Tensor],
        input: &Tensor,
        root: usize,
        opts: &OpOptions,
    ) -> Result<Work> {
        let keep = owners(outputs.iter().chain([input]));
        let me = self.shared.rank;
        self.launch("gather", opts, keep, false, |e| {
            e.group(|e| {
                e.send(input, root)?;
                if me == root {
                    for (p, out) in outputs.iter().enumerate() {
                        e.recv(out, p)?;
                    }
                }
                Ok(())
            })
        })
    }

    fn barrier(&self, opts: &OpOptions) -> Result<Work> {
        let b = Arc::clone(&self.barrier_buf);
        let keep: KeepAlive = vec![b.clone()];
        self.launch("barrier", opts, keep, true, |e| {
            // SAFETY: the barrier buffer holds one i32 and lives as long as the backend.
            let rc = unsafe {
                (e.nccl().all_reduce)(
                    b.as_ptr() as *const c_void,
                    b.as_ptr() as *mut c_void,
                    1,
                    sys::NCCL_INT32,
                    sys::NCCL_SUM,
                    e.comm,
                    e.stream,
                )
            };
            e.s.check("ncclAllReduce", rc)
        })
    }

    fn send(&self, t: &Tensor, peer: usize, opts: &OpOptions) -> Result<Work> {
        self.launch("send", opts, owners([t]), false, |e| e.send(t, peer))
    }

    fn recv(&self, t: &Tensor, peer: usize, opts: &OpOptions) -> Result<Work> {
        self.launch("recv", opts, owners([t]), false, |e| e.recv(t, peer))
    }

    fn batch_p2p(&self, ops: &[P2POp], opts: &OpOptions) -> Result<Work> {
        let keep = owners(ops.iter().map(P2POp::tensor));
        self.launch("batch_p2p", opts, keep, false, |e| {
            e.group(|e| {
                for o in ops {
                    match o {
                        P2POp::Send { tensor, peer } => e.send(tensor, *peer)?,
                        P2POp::Recv { tensor, peer } => e.recv(tensor, *peer)?,
                    }
                }
                Ok(())
            })
        })
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
            Arc::clone(&s.ctx),
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
        self.shared.stream.as_raw().0
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
    fn reductions_map_onto_nccl_or_kernels() {
        let native = |d, o| match red(d, o) {
            Ok(Red::Native(x)) => Some(x),
            _ => None,
        };
        assert_eq!(native(DataType::F32, ReduceOp::Sum), Some(sys::NCCL_SUM));
        assert_eq!(native(DataType::I8, ReduceOp::Avg), Some(sys::NCCL_AVG));
        // bool: or is max, and is min; xor needs the kernels.
        assert_eq!(native(DataType::Bool, ReduceOp::Sum), Some(sys::NCCL_MAX));
        assert_eq!(native(DataType::Bool, ReduceOp::BAnd), Some(sys::NCCL_MIN));
        assert!(matches!(
            red(DataType::Bool, ReduceOp::BXor),
            Ok(Red::Kernel)
        ));
        assert!(matches!(red(DataType::I32, ReduceOp::BOr), Ok(Red::Kernel)));
        assert!(matches!(
            red(DataType::BF16, ReduceOp::PremulSum { factor: 0.5 }),
            Ok(Red::PreMul(f)) if f == 0.5
        ));
        assert!(red(DataType::F16, ReduceOp::BXor).is_err());
        assert!(red(DataType::Bool, ReduceOp::Avg).is_err());
    }

    #[test]
    fn premul_scalars_are_in_the_element_type() {
        assert_eq!(
            &premul_scalar(DataType::F16, 2.0)[..2],
            &half::f16::from_f64(2.0).to_le_bytes()
        );
        assert_eq!(
            &premul_scalar(DataType::F32, 0.5)[..4],
            &0.5f32.to_le_bytes()
        );
        assert_eq!(premul_scalar(DataType::I64, 3.0), 3i64.to_le_bytes());
        assert_eq!(premul_scalar(DataType::I8, -2.0)[0], (-2i8) as u8);
    }

    #[test]
    fn adjacent_blocks() {
        let t = Tensor::zeros(DataType::F32, 12);
        let blocks: Vec<Tensor> = (0..3).map(|i| t.narrow(4 * i, 4)).collect();
        assert!(adjacent(&blocks));
        let gap = vec![t.narrow(0, 4), t.narrow(8, 4)];
        assert!(!adjacent(&gap));
        let uneven = vec![t.narrow(0, 4), t.narrow(4, 2)];
        assert!(!adjacent(&uneven));
    }

    #[test]
    fn generations_count_per_name() {
        let a = generation("gen-test-a");
        assert_eq!(generation("gen-test-a"), a + 1);
        assert_eq!(generation("gen-test-b"), 1);
    }
}
