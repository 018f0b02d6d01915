//! The engine's side of colltrace and the cvars: what each operation looks like in a trace, when
//! a failure dumps, and how configuration errors read.

use std::net::IpAddr;
use std::sync::Arc;

use colltrace::{CommMeta, CommTrace, OpInfo, Outcome, Trigger};

use super::op::{Op, P2p};
use super::CommConfig;
use crate::bootstrap::Store;
use crate::error::{Error, Result};

/// A configuration error as the engine reports it: the variable, what is allowed (and where
/// the value came from), the value.
pub(crate) fn cvar_error(e: torchcomms_cvars::Error) -> Error {
    Error::invalid(e.name(), e.expected(), e.value())
}

/// The trace of a new communicator whose members have the global ranks `global_ranks`.
pub(crate) fn new_trace(config: &CommConfig, global_ranks: Vec<usize>) -> Arc<CommTrace> {
    colltrace::configure(&config.trace);
    let global = global_ranks
        .get(config.rank)
        .copied()
        .unwrap_or(config.rank);
    let meta = CommMeta {
        name: config.name.clone(),
        instance: colltrace::next_instance(&config.name, global),
        rank: config.rank,
        size: config.size,
        global_ranks,
    };
    CommTrace::new(meta, config.trace.buffer_size)
}

/// How `result` ends a traced operation.
pub(crate) fn outcome<'a>(result: &'a Result<()>) -> Outcome<'a> {
    match result {
        Ok(()) => Outcome::Completed,
        Err(e) if e.is_timeout() => Outcome::TimedOut(e),
        Err(e) => Outcome::Failed(e),
    }
}

/// Records that the communicator failed with `err` and dumps when configured to.
pub(crate) fn report_failure(trace: &CommTrace, err: &Error) {
    let trigger = if err.is_timeout() {
        Trigger::Timeout
    } else {
        Trigger::Error
    };
    colltrace::on_failure(trace, trigger, &err.to_string());
}

/// Ends the `init` step of a new communicator's trace; a failed creation counts as a failure
/// of the communicator (it dumps).
pub(crate) fn end_init<T>(trace: &CommTrace, step: colltrace::OpHandle, result: &Result<T>) {
    match result {
        Ok(_) => step.finish(Outcome::Completed),
        Err(e) => {
            step.finish(outcome(&Err(e.clone())));
            report_failure(trace, e);
        }
    }
}

/// Publishes the live endpoint of this process, when it serves one: under the communicator's
/// prefix (`colltrace/http/<rank>`), and in the job-wide index that `comms-analyzer watch
/// --store` reads (`torchcomms/colltrace/count`, `torchcomms/colltrace/endpoint/<i>`).
pub(crate) fn publish_endpoint(
    root: &dyn Store,
    prefixed: &dyn Store,
    config: &CommConfig,
    advertised: IpAddr,
) {
    let Some(addr) = colltrace::http_addr() else {
        return;
    };
    let ip = if addr.ip().is_unspecified() {
        advertised
    } else {
        addr.ip()
    };
    let ep = std::net::SocketAddr::new(ip, addr.port()).to_string();
    let publish = || -> Result<()> {
        prefixed.set(&format!("colltrace/http/{}", config.rank), ep.as_bytes())?;
        let i = root.add("torchcomms/colltrace/count", 1)? - 1;
        root.set(
            &format!("torchcomms/colltrace/endpoint/{i}"),
            format!("{} {} {ep}", config.rank, config.name).as_bytes(),
        )
    };
    if let Err(e) = publish() {
        tracing::warn!(comm = %config.name, "colltrace: cannot publish the live endpoint {ep}: {e}");
    }
}

/// What a trace records about `op` when it is submitted.
pub(crate) fn op_info(op: &Op, timeout: std::time::Duration, async_op: Option<bool>) -> OpInfo {
    let total = |spans: &[crate::span::Span]| spans.iter().map(|s| s.len() as u64).sum::<u64>();
    let mut i = OpInfo {
        op: op.name(),
        async_op,
        timeout,
        ..OpInfo::default()
    };
    match op {
        Op::AllReduce { buf, dtype, op } => {
            i.dtype = Some(dtype.name());
            i.count = Some((buf.len() / dtype.size_bytes().max(1)) as u64);
            i.reduce_op = Some(op.name());
            (i.in_bytes, i.out_bytes) = (buf.len() as u64, buf.len() as u64);
        }
        Op::Reduce {
            buf,
            dtype,
            op,
            root,
        } => {
            i.dtype = Some(dtype.name());
            i.count = Some((buf.len() / dtype.size_bytes().max(1)) as u64);
            i.reduce_op = Some(op.name());
            i.root = Some(*root);
            (i.in_bytes, i.out_bytes) = (buf.len() as u64, buf.len() as u64);
        }
        Op::Broadcast { buf, root } => {
            i.root = Some(*root);
            (i.in_bytes, i.out_bytes) = (buf.len() as u64, buf.len() as u64);
        }
        Op::AllGather { input, outputs } => {
            (i.in_bytes, i.out_bytes) = (input.len() as u64, total(outputs));
        }
        // Capacities: how much moves is known only when the operation runs.
        Op::AllToAllDynamic(a) => {
            (i.in_bytes, i.out_bytes) = (a.input.len() as u64, a.output.len() as u64);
        }
        Op::ReduceScatter {
            inputs,
            output,
            dtype,
            op,
        } => {
            i.dtype = Some(dtype.name());
            i.count = Some((output.len() / dtype.size_bytes().max(1)) as u64);
            i.reduce_op = Some(op.name());
            (i.in_bytes, i.out_bytes) = (total(inputs), output.len() as u64);
        }
        Op::AllToAll { inputs, outputs } => {
            (i.in_bytes, i.out_bytes) = (total(inputs), total(outputs));
        }
        Op::Scatter {
            inputs,
            output,
            root,
        } => {
            i.root = Some(*root);
            (i.in_bytes, i.out_bytes) = (total(inputs), output.len() as u64);
        }
        Op::Gather {
            input,
            outputs,
            root,
        } => {
            i.root = Some(*root);
            (i.in_bytes, i.out_bytes) = (input.len() as u64, total(outputs));
        }
        Op::Barrier => {}
        Op::Window(w) => i.in_bytes = w.bytes() as u64,
        Op::Send { buf, peer } => {
            i.peer = Some(*peer);
            i.in_bytes = buf.len() as u64;
        }
        Op::Recv { buf, peer } => {
            i.peer = Some(*peer);
            i.out_bytes = buf.len() as u64;
        }
        Op::Batch { ops } => {
            for p in ops {
                let (send, peer, bytes) = match p {
                    P2p::Send { buf, peer } => (true, *peer, buf.len() as u64),
                    P2p::Recv { buf, peer } => (false, *peer, buf.len() as u64),
                };
                if send {
                    i.in_bytes += bytes;
                } else {
                    i.out_bytes += bytes;
                }
                i.peers
                    .push(colltrace::schema::PeerTransfer { send, peer, bytes });
            }
        }
    }
    i
}
