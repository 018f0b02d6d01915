//! How one operation on device buffers runs through host staging: which device ranges are
//! copied in before the host runs it, which are copied back after, and the host operation over
//! the staging memory, cut into steps that pipeline (copies of one step overlap the network
//! transfers of another).

use crate::comm::op::{Op, P2p};
use crate::span::Span;

/// A device range and where it sits in staging.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Copy {
    pub(crate) device: u64,
    pub(crate) staging: usize,
    pub(crate) len: usize,
}

/// One step: copy `inputs` to staging, run `host` there, copy `outputs` back.
#[derive(Debug)]
pub(crate) struct Step {
    pub(crate) inputs: Vec<Copy>,
    pub(crate) host: Op,
    pub(crate) outputs: Vec<Copy>,
}

/// The steps of one operation.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) steps: Vec<Step>,
}

/// What the host operation does with a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    In,
    Out,
    InOut,
}

impl Role {
    fn reads(self) -> bool {
        matches!(self, Role::In | Role::InOut)
    }
    fn writes(self) -> bool {
        matches!(self, Role::Out | Role::InOut)
    }
}

/// Staging regions start on cache lines.
const ALIGN: usize = 64;

/// Rebuilds `op` with every buffer passed through `f` (with its role on this rank).
fn map_spans(op: &Op, rank: usize, f: &mut dyn FnMut(Span, Role) -> Span) -> Op {
    fn all(v: &[Span], role: Role, f: &mut dyn FnMut(Span, Role) -> Span) -> Vec<Span> {
        v.iter().map(|s| f(*s, role)).collect()
    }
    match op {
        Op::AllReduce { buf, dtype, op } => Op::AllReduce {
            buf: f(*buf, Role::InOut),
            dtype: *dtype,
            op: *op,
        },
        Op::Reduce {
            buf,
            dtype,
            op,
            root,
        } => Op::Reduce {
            buf: f(*buf, if rank == *root { Role::InOut } else { Role::In }),
            dtype: *dtype,
            op: *op,
            root: *root,
        },
        Op::Broadcast { buf, root } => Op::Broadcast {
            buf: f(*buf, if rank == *root { Role::In } else { Role::Out }),
            root: *root,
        },
        Op::AllGather { input, outputs } => {
            let input = f(*input, Role::In);
            Op::AllGather {
                input,
                outputs: all(outputs, Role::Out, f),
            }
        }
        Op::ReduceScatter {
            inputs,
            output,
            dtype,
            op,
        } => {
            let inputs = all(inputs, Role::In, f);
            Op::ReduceScatter {
                inputs,
                output: f(*output, Role::Out),
                dtype: *dtype,
                op: *op,
            }
        }
        Op::AllToAll { inputs, outputs } => {
            let inputs = all(inputs, Role::In, f);
            Op::AllToAll {
                inputs,
                outputs: all(outputs, Role::Out, f),
            }
        }
        Op::Scatter {
            inputs,
            output,
            root,
        } => {
            let inputs = all(inputs, Role::In, f);
            Op::Scatter {
                inputs,
                output: f(*output, Role::Out),
                root: *root,
            }
        }
        Op::Gather {
            input,
            outputs,
            root,
        } => {
            let input = f(*input, Role::In);
            Op::Gather {
                input,
                outputs: all(outputs, Role::Out, f),
                root: *root,
            }
        }
        Op::Barrier => Op::Barrier,
        Op::Send { buf, peer } => Op::Send {
            buf: f(*buf, Role::In),
            peer: *peer,
        },
        Op::Recv { buf, peer } => Op::Recv {
            buf: f(*buf, Role::Out),
            peer: *peer,
        },
        Op::Batch { ops } => Op::Batch {
            ops: ops
                .iter()
                .map(|p| match p {
                    P2p::Send { buf, peer } => P2p::Send {
                        buf: f(*buf, Role::In),
                        peer: *peer,
                    },
                    P2p::Recv { buf, peer } => P2p::Recv {
                        buf: f(*buf, Role::Out),
                        peer: *peer,
                    },
                })
                .collect(),
        },
    }
}

/// The step sizes of an operation that every rank cuts the same way: the single-buffer
/// collectives, whose size every rank shares. Others run as one step (all_to_all_v's sizes,
/// for one, differ per rank, and ranks must agree on the steps).
fn chunkable(op: &Op) -> Option<(Span, usize)> {
    match op {
        Op::AllReduce { buf, dtype, .. } | Op::Reduce { buf, dtype, .. } => {
            Some((*buf, dtype.size_bytes()))
        }
        Op::Broadcast { buf, .. } => Some((*buf, 1)),
        _ => None,
    }
}

/// One staging region per buffer, in the order map_spans visits them (buffer, role, offset),
/// and the staging bytes they need in all.
fn regions(op: &Op, rank: usize) -> (Vec<(Span, Role, usize)>, usize) {
    let mut regions = Vec::new();
    let mut bytes = 0usize;
    map_spans(op, rank, &mut |s, role| {
        regions.push((s, role, bytes));
        bytes += s.len().div_ceil(ALIGN) * ALIGN;
        s
    });
    (regions, bytes)
}

/// The staging bytes [`plan`] lays `op` out in (taken before the staging exists).
pub(crate) fn staging_bytes(op: &Op, rank: usize) -> usize {
    regions(op, rank).1
}

/// Plans `op` (over device buffers) for staging. `base` is the staging address the host
/// operation will see (the pinned buffer's host address); `chunk` the step size in bytes.
pub(crate) fn plan(op: &Op, rank: usize, base: *mut u8, chunk: usize) -> Plan {
    let (regions, _) = regions(op, rank);
    let staged = |off: usize, len: usize| -> Span {
        if len == 0 {
            return Span::EMPTY;
        }
        // SAFETY: the staging buffer (at `base`, at least `bytes` long) outlives every host
        // operation of this plan: the GPE returns it to its pool only after the last step's
        // copies back have run.
        unsafe { Span::from_raw(base.add(off), len) }
    };
    let copy = |s: &Span, off: usize| Copy {
        device: s.addr() as u64,
        staging: off,
        len: s.len(),
    };
    if let Some((buf, elem)) = chunkable(op) {
        let (_, role, off) = regions[0];
        let step = (chunk / elem).max(1) * elem;
        let n = buf.len().div_ceil(step).max(1);
        let steps = (0..n)
            .map(|k| {
                let start = k * step;
                let len = buf.len().saturating_sub(start).min(step);
                let dev = buf.sub(start.min(buf.len()), len);
                let host_buf = staged(off + start, len);
                let host = map_spans(op, rank, &mut |_, _| host_buf);
                Step {
                    inputs: if role.reads() {
                        vec![copy(&dev, off + start)]
                    } else {
                        vec![]
                    },
                    host,
                    outputs: if role.writes() {
                        vec![copy(&dev, off + start)]
                    } else {
                        vec![]
                    },
                }
            })
            .collect();
        return Plan { steps };
    }
    let mut i = 0;
    let host = map_spans(op, rank, &mut |_, _| {
        let (s, _, off) = regions[i];
        i += 1;
        staged(off, s.len())
    });
    let pick = |want: fn(Role) -> bool| -> Vec<Copy> {
        regions
            .iter()
            .filter(|(s, r, _)| want(*r) && !s.is_empty())
            .map(|(s, _, off)| copy(s, *off))
            .collect()
    };
    Plan {
        steps: vec![Step {
            inputs: pick(Role::reads),
            host,
            outputs: pick(Role::writes),
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{DataType, ReduceOp};

    fn span(addr: usize, len: usize) -> Span {
        // SAFETY: never dereferenced: the plan only reads addresses and lengths.
        unsafe { Span::from_raw(addr as *mut u8, len) }
    }

    #[test]
    fn all_reduce_is_cut_into_element_aligned_steps() {
        let mut staging = vec![0u8; 1 << 12];
        let op = Op::AllReduce {
            buf: span(0x1000_0000, 1000),
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        let p = plan(&op, 0, staging.as_mut_ptr(), 300);
        assert_eq!(staging_bytes(&op, 0), 1024);
        let lens: Vec<usize> = p.steps.iter().map(|s| s.inputs[0].len).collect();
        assert_eq!(lens, vec![300, 300, 300, 100]);
        assert_eq!(p.steps[3].outputs[0].device, 0x1000_0000 + 900);
        assert_eq!(p.steps[3].outputs[0].staging, 900);
        match &p.steps[1].host {
            Op::AllReduce { buf, .. } => {
                assert_eq!(buf.addr(), staging.as_ptr() as usize + 300);
                assert_eq!(buf.len(), 300);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn broadcast_copies_in_on_root_and_out_elsewhere() {
        let mut staging = vec![0u8; 256];
        let op = Op::Broadcast {
            buf: span(0x2000, 100),
            root: 1,
        };
        let root = plan(&op, 1, staging.as_mut_ptr(), 1 << 20);
        assert_eq!(
            (root.steps[0].inputs.len(), root.steps[0].outputs.len()),
            (1, 0)
        );
        let other = plan(&op, 0, staging.as_mut_ptr(), 1 << 20);
        assert_eq!(
            (other.steps[0].inputs.len(), other.steps[0].outputs.len()),
            (0, 1)
        );
    }

    #[test]
    fn all_gather_stages_every_buffer_once_in_one_step() {
        let mut staging = vec![0u8; 1024];
        let op = Op::AllGather {
            input: span(0x3000, 10),
            outputs: vec![span(0x4000, 10), span(0x5000, 10), span(0x6000, 0)],
        };
        let p = plan(&op, 0, staging.as_mut_ptr(), 4);
        assert_eq!(p.steps.len(), 1);
        assert_eq!(staging_bytes(&op, 0), 3 * ALIGN);
        let s = &p.steps[0];
        assert_eq!(s.inputs.len(), 1);
        assert_eq!(
            s.outputs.iter().map(|c| c.staging).collect::<Vec<_>>(),
            vec![64, 128]
        );
        match &s.host {
            Op::AllGather { input, outputs } => {
                assert_eq!(input.addr(), staging.as_ptr() as usize);
                assert_eq!(outputs[1].addr(), staging.as_ptr() as usize + 128);
                assert!(outputs[2].is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn empty_all_reduce_is_one_empty_step() {
        let op = Op::AllReduce {
            buf: Span::EMPTY,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        let p = plan(&op, 0, std::ptr::null_mut(), 64);
        assert_eq!(p.steps.len(), 1);
        assert_eq!(staging_bytes(&op, 0), 0);
    }
}
