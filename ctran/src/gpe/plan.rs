//! How one operation on device buffers runs through host staging: which device ranges are
//! copied in before the host runs it, which are copied back after, and the host operation over
//! the staging memory, cut into steps that pipeline (copies of one step overlap the network
//! transfers of another).

use crate::comm::op::{Op, P2p};
use crate::span::Span;
use crate::window::WindowOp;

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
pub(crate) enum Role {
    /// Only read.
    In,
    /// Only written.
    Out,
    /// Read and written.
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

/// The plan of an operation whose device buffers the transports move in place: one step, the
/// operation itself, nothing copied.
pub(crate) fn in_place(op: Op) -> Plan {
    Plan {
        steps: vec![Step {
            inputs: Vec::new(),
            host: op,
            outputs: Vec::new(),
        }],
    }
}

/// Rebuilds `op` with every buffer passed through `f` (with its role on this rank).
pub(crate) fn map_spans(op: &Op, rank: usize, f: &mut dyn FnMut(Span, Role) -> Span) -> Op {
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
        // The output goes both ways: rows past what peers send keep the caller's bytes.
        Op::AllToAllDynamic(a) => {
            let mut a = *a;
            a.input = f(a.input, Role::In);
            a.input_counts = f(a.input_counts, Role::In);
            a.output = f(a.output, Role::InOut);
            a.output_counts = f(a.output_counts, Role::Out);
            Op::AllToAllDynamic(a)
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
        // A put's source is staged in; a put to self writes a part of the (device) window, so
        // it is staged out. Signals and waits have no buffers; registration never runs here.
        Op::Window(WindowOp::Put {
            src,
            peer,
            key,
            offset,
        }) => Op::Window(WindowOp::Put {
            src: f(*src, Role::In),
            peer: *peer,
            key: *key,
            offset: *offset,
        }),
        Op::Window(WindowOp::LocalPut { src, dst }) => {
            let src = f(*src, Role::In);
            Op::Window(WindowOp::LocalPut {
                src,
                dst: f(*dst, Role::Out),
            })
        }
        Op::Window(w) => Op::Window(w.clone()),
    }
}

/// The length every buffer of `op` shares and the unit it may be cut in, when every rank can
/// cut the operation into the same steps: a step then takes the same slice of each buffer.
/// The single-buffer collectives qualify; all_gather and reduce_scatter when their blocks are
/// equal (every rank sees the same block sizes); all_to_all only when the caller declared
/// uniform blocks, since its sizes may otherwise differ per rank, and ranks must agree on the
/// number of steps. Everything else runs as one step.
fn lockstep(op: &Op, uniform: bool) -> Option<(usize, usize)> {
    fn equal(spans: &[Span]) -> Option<usize> {
        let len = spans.first()?.len();
        spans.iter().all(|s| s.len() == len).then_some(len)
    }
    match op {
        Op::AllReduce { buf, dtype, .. } | Op::Reduce { buf, dtype, .. } => {
            Some((buf.len(), dtype.size_bytes()))
        }
        Op::Broadcast { buf, .. } => Some((buf.len(), 1)),
        Op::AllGather { input, outputs } => {
            equal(outputs).filter(|&l| l == input.len()).map(|l| (l, 1))
        }
        Op::ReduceScatter {
            inputs,
            output,
            dtype,
            ..
        } => equal(inputs)
            .filter(|&l| l == output.len())
            .map(|l| (l, dtype.size_bytes())),
        Op::AllToAll { inputs, outputs } if uniform => {
            let l = equal(inputs)?;
            (equal(outputs) == Some(l)).then_some((l, 1))
        }
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
/// operation will see (the pinned buffer's host address); `chunk` the bytes one step moves
/// through staging in all; `uniform` whether the caller declared equal blocks on every rank.
pub(crate) fn plan(op: &Op, rank: usize, base: *mut u8, chunk: usize, uniform: bool) -> Plan {
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
    // Every buffer is cut at the same offsets; a plan that cannot be cut is one step over the
    // whole buffers.
    let (len, per) = match lockstep(op, uniform) {
        Some((len, unit)) if len > 0 => {
            let per_buffer = chunk / regions.len().max(1);
            (len, (per_buffer / unit).max(1) * unit)
        }
        _ => (0, usize::MAX),
    };
    let n = len.div_ceil(per).max(1);
    let steps = (0..n)
        .map(|k| {
            let start = k * per;
            // The slice of buffer `s` this step takes (all of it when not cut: one step from 0).
            let slice = |s: &Span| (start, s.len().saturating_sub(start).min(per));
            let mut i = 0;
            let host = map_spans(op, rank, &mut |_, _| {
                let (s, _, off) = regions[i];
                i += 1;
                let (from, l) = slice(&s);
                staged(off + from, l)
            });
            let copies = |want: fn(Role) -> bool| -> Vec<Copy> {
                regions
                    .iter()
                    .filter(|(_, r, _)| want(*r))
                    .filter_map(|(s, _, off)| {
                        let (from, l) = slice(s);
                        (l > 0).then(|| Copy {
                            device: s.addr() as u64 + from as u64,
                            staging: off + from,
                            len: l,
                        })
                    })
                    .collect()
            };
            Step {
                inputs: copies(Role::reads),
                host,
                outputs: copies(Role::writes),
            }
        })
        .collect();
    Plan { steps }
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
        let p = plan(&op, 0, staging.as_mut_ptr(), 300, false);
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
        let root = plan(&op, 1, staging.as_mut_ptr(), 1 << 20, false);
        assert_eq!(
            (root.steps[0].inputs.len(), root.steps[0].outputs.len()),
            (1, 0)
        );
        let other = plan(&op, 0, staging.as_mut_ptr(), 1 << 20, false);
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
        let p = plan(&op, 0, staging.as_mut_ptr(), 4, false);
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
    fn equal_blocks_are_cut_in_lockstep() {
        let mut staging = vec![0u8; 1024];
        let base = staging.as_mut_ptr() as usize;
        let op = Op::AllGather {
            input: span(0x3000, 100),
            outputs: vec![span(0x4000, 100), span(0x5000, 100)],
        };
        // 120 bytes a step over 3 buffers: 40 of each, so 3 steps (40, 40, 20).
        let p = plan(&op, 1, staging.as_mut_ptr(), 120, false);
        assert_eq!(p.steps.len(), 3);
        let last = &p.steps[2];
        assert_eq!(
            (
                last.inputs[0].device,
                last.inputs[0].staging,
                last.inputs[0].len
            ),
            (0x3000 + 80, 80, 20)
        );
        assert_eq!(
            last.outputs
                .iter()
                .map(|c| (c.device, c.staging))
                .collect::<Vec<_>>(),
            vec![(0x4000 + 80, 128 + 80), (0x5000 + 80, 256 + 80)]
        );
        match &last.host {
            Op::AllGather { input, outputs } => {
                assert_eq!((input.addr(), input.len()), (base + 80, 20));
                assert_eq!((outputs[1].addr(), outputs[1].len()), (base + 256 + 80, 20));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn all_to_all_is_cut_only_when_declared_uniform() {
        let mut staging = vec![0u8; 1024];
        let op = Op::AllToAll {
            inputs: vec![span(0x1000, 64), span(0x2000, 64)],
            outputs: vec![span(0x3000, 64), span(0x4000, 64)],
        };
        assert_eq!(
            plan(&op, 0, staging.as_mut_ptr(), 128, false).steps.len(),
            1
        );
        assert_eq!(plan(&op, 0, staging.as_mut_ptr(), 128, true).steps.len(), 2);
    }

    #[test]
    fn empty_all_reduce_is_one_empty_step() {
        let op = Op::AllReduce {
            buf: Span::EMPTY,
            dtype: DataType::F32,
            op: ReduceOp::Sum,
        };
        let p = plan(&op, 0, std::ptr::null_mut(), 64, false);
        assert_eq!(p.steps.len(), 1);
        assert_eq!(staging_bytes(&op, 0), 0);
    }
}
