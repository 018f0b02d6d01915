//! The pipelined all_reduce for large messages: copy engines move the data, kernels only reduce.
//!
//! Two H200s move about 385 GB/s each way with copy engines (`docs/perf/gpu.md`), more than the
//! two-shot kernel's loads and stores reach while they also reduce. So rank r owns slice r of
//! the buffer (cut as in the two-shot), and for each chunk c of the slices, on three streams
//! ("lanes") that overlap:
//! - **scatter**: copy engines write chunk c of every peer's slice into that peer's scratch
//!   (a ring of `slots` chunks per source in its arena), then raise *arrived(c)* in every peer;
//! - **reduce**: once every peer's chunk c has arrived, a kernel sums it with our own chunk in
//!   local memory, in place, then raises *free(c)* so peers may reuse the scratch slot;
//! - **gather**: copy engines write the sum into every peer's buffer.
//!
//! The copies never read a peer's memory (writes cross NVLink best), a flag wait is a
//! one-warp kernel that gives up after the timeout, and a start and an end barrier bracket
//! the operation: after the start every peer's buffer and scratch are ours to write, after the
//! end every peer has written ours. [`schedule`] lists the steps; the transport issues them.
//!
//! A large broadcast between two GPUs takes the same way ([`broadcast_schedule`]): between the
//! barriers the root's copy engine writes its buffer into the peer's, which moves more than the
//! direct kernel's stores.

use super::kernels::{PipeFlag, MAX_RANKS};

use super::plan::{two_shot_slice, Layout};

/// One of the streams the schedule runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The comm's stream: barriers, and where the lanes fork from and join.
    Main,
    /// Copies into peers' scratch.
    Scatter,
    /// Local reductions.
    Reduce,
    /// Copies of sums into peers' buffers.
    Gather,
}

/// The side lanes, forked from [`Lane::Main`] after the start barrier and joined before the end.
pub const SIDE_LANES: [Lane; 3] = [Lane::Scatter, Lane::Reduce, Lane::Gather];

/// One step of the schedule, issued in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Raise a flag in every peer, then wait for one from every peer, then advance the comm's
    /// pipeline base (flag values are relative to it).
    Sync {
        /// Where it runs.
        lane: Lane,
        /// The flag raised and its value.
        signal: Option<(PipeFlag, u64)>,
        /// The flag awaited and the least value.
        wait: Option<(PipeFlag, u64)>,
        /// Added to the base afterwards.
        advance: u64,
    },
    /// A copy-engine copy.
    Copy {
        /// Where it runs.
        lane: Lane,
        /// Destination address.
        dst: u64,
        /// Source address.
        src: u64,
        /// Bytes.
        len: usize,
    },
    /// A local reduction on [`Lane::Reduce`].
    Reduce {
        /// Where the result goes.
        dst: u64,
        /// The inputs (`dst` may be one of them).
        srcs: Vec<u64>,
        /// Bytes of each.
        len: usize,
    },
    /// `to` waits for everything issued on `from` so far.
    Order {
        /// The lane waited for.
        from: Lane,
        /// The lane that waits.
        to: Lane,
    },
}

/// How the slices are cut into chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunking {
    /// (offset, length) of each chunk within the longest slice (others are clipped to theirs).
    pub bounds: Vec<(usize, usize)>,
    /// Bytes of a scratch slot (the largest chunk, a multiple of 16).
    pub slot_bytes: usize,
    /// Scratch slots per source rank.
    pub slots: usize,
}

/// The largest automatic chunk. Fewer, larger chunks moved more: on 2 H200 a 1 GiB all_reduce
/// in chunks of 4 / 16 / 32 / 64 MiB moved 238 / 343 / 350 / 362 GB/s (at 4 MiB the host
/// issued chunks slower than the link moved them), and chunks halving towards the end of the
/// slice, to shorten the last reduction, lost more than they saved (354).
const MAX_AUTO_CHUNK: usize = 64 << 20;
/// Fewest chunks per slice, so that scattering one overlaps gathering the other (a 64 MiB
/// all_reduce in one 32 MiB chunk per slice moved 263 GB/s, the two-shot kernel 301).
const MIN_CHUNKS: usize = 2;
/// Fewest scratch slots per source: a peer may scatter chunk c+1 while we reduce chunk c.
const MIN_SLOTS: usize = 2;

/// The chunking for a `bytes` all_reduce over `nranks` with `scratch_bytes` of scratch per rank
/// and the largest chunk `largest` (0: automatic); `None` when the scratch cannot hold two
/// slots of 16 bytes per source. The same on every rank.
pub fn chunking(
    bytes: usize,
    nranks: usize,
    scratch_bytes: usize,
    largest: usize,
) -> Option<Chunking> {
    let sources = nranks.checked_sub(1).filter(|&s| s > 0)?;
    let fits = scratch_bytes / (MIN_SLOTS * sources) / 16 * 16;
    if fits == 0 {
        return None;
    }
    let asked = if largest > 0 { largest } else { MAX_AUTO_CHUNK };
    let slice = two_shot_slice(bytes, nranks, 0).1;
    let chunk = asked
        .min(slice.div_ceil(MIN_CHUNKS))
        .div_ceil(16)
        .saturating_mul(16)
        .clamp(16, fits);
    Some(Chunking {
        bounds: (0..slice)
            .step_by(chunk)
            .map(|at| (at, chunk.min(slice - at)))
            .collect(),
        slot_bytes: chunk,
        slots: scratch_bytes / (chunk * sources),
    })
}

/// Flag values of one operation, relative to the base: the barriers, then one per chunk.
const START: u64 = 1;
const END: u64 = 2;
fn chunk_value(c: usize) -> u64 {
    c as u64 + 1
}

/// The steps of one pipelined all_reduce of `bytes` on rank `l.rank`, whose buffer is at
/// `buf[q]` on rank q (addresses here; this rank's own at `buf[l.rank]`); peers' scratch is
/// `l.scratch`.
pub fn schedule(l: &Layout, buf: &[u64; MAX_RANKS], bytes: usize, k: &Chunking) -> Vec<Step> {
    let (r, n) = (l.rank, l.nranks);
    let slice = |q: usize| two_shot_slice(bytes, n, q);
    let nchunks = k.bounds.len();
    // Chunk c of slice q: (offset in the buffer, length).
    let piece = |q: usize, c: usize| {
        let (off, len) = slice(q);
        let (at, size) = k.bounds[c];
        let lo = at.min(len);
        let hi = (at + size).min(len);
        (off + lo, hi - lo)
    };
    // Where source `from`'s chunk in slot `s` lands in `owner`'s scratch.
    let slot = |owner: usize, s: usize, from: usize| {
        let j = (from + n - owner - 1) % n;
        l.scratch[owner] + ((s * (n - 1) + j) * k.slot_bytes) as u64
    };
    let peers = || (1..n).map(move |i| (r + i) % n);
    let mut steps = vec![Step::Sync {
        lane: Lane::Main,
        signal: Some((PipeFlag::Barrier, START)),
        wait: Some((PipeFlag::Barrier, START)),
        advance: 0,
    }];
    for lane in SIDE_LANES {
        steps.push(Step::Order {
            from: Lane::Main,
            to: lane,
        });
    }
    for c in 0..nchunks {
        let s = c % k.slots;
        for q in peers() {
            let (off, len) = piece(q, c);
            if len > 0 {
                steps.push(Step::Copy {
                    lane: Lane::Scatter,
                    dst: slot(q, s, r),
                    src: buf[r] + off as u64,
                    len,
                });
            }
        }
        // Before chunk c + 1 goes into the slot chunk c + 1 - slots used, its owner must have
        // reduced that one.
        let next = c + 1;
        steps.push(Step::Sync {
            lane: Lane::Scatter,
            signal: Some((PipeFlag::Arrived, chunk_value(c))),
            wait: (next < nchunks && next >= k.slots)
                .then(|| (PipeFlag::Free, chunk_value(next - k.slots))),
            advance: 0,
        });
        steps.push(Step::Sync {
            lane: Lane::Reduce,
            signal: c
                .checked_sub(1)
                .map(|prev| (PipeFlag::Free, chunk_value(prev))),
            wait: Some((PipeFlag::Arrived, chunk_value(c))),
            advance: 0,
        });
        let (off, len) = piece(r, c);
        let mine = buf[r] + off as u64;
        let mut srcs = vec![mine];
        srcs.extend(peers().map(|q| slot(r, s, q)));
        steps.push(Step::Reduce {
            dst: mine,
            srcs,
            len,
        });
        steps.push(Step::Order {
            from: Lane::Reduce,
            to: Lane::Gather,
        });
        if len > 0 {
            for q in peers() {
                steps.push(Step::Copy {
                    lane: Lane::Gather,
                    dst: buf[q] + off as u64,
                    src: mine,
                    len,
                });
            }
        }
    }
    for lane in SIDE_LANES {
        steps.push(Step::Order {
            from: lane,
            to: Lane::Main,
        });
    }
    steps.push(Step::Sync {
        lane: Lane::Main,
        signal: Some((PipeFlag::Barrier, END)),
        wait: Some((PipeFlag::Barrier, END)),
        advance: nchunks as u64 + END,
    });
    steps
}

/// The steps of a broadcast of `bytes` from `root`, whose buffer is at `buf[q]` on rank q:
/// after the start barrier the root copies its buffer into every peer's (one after another on
/// the comm's stream), and the end barrier tells peers it has landed.
pub fn broadcast_schedule(
    l: &Layout,
    buf: &[u64; MAX_RANKS],
    bytes: usize,
    root: usize,
) -> Vec<Step> {
    let barrier = |value: u64, advance: u64| Step::Sync {
        lane: Lane::Main,
        signal: Some((PipeFlag::Barrier, value)),
        wait: Some((PipeFlag::Barrier, value)),
        advance,
    };
    let mut steps = vec![barrier(START, 0)];
    if l.rank == root && bytes > 0 {
        for q in (1..l.nranks).map(|i| (root + i) % l.nranks) {
            steps.push(Step::Copy {
                lane: Lane::Main,
                dst: buf[q],
                src: buf[root],
                len: bytes,
            });
        }
    }
    steps.push(barrier(END, END));
    steps
}

#[cfg(test)]
mod tests {
    //! The schedule runs here on a model: every rank's lanes advance one step at a time in a
    //! random interleaving, copies and reductions act on memory at once, flags and stream
    //! order are honoured. The sums must be right on every rank under every interleaving, which
    //! fails if a copy can overwrite a scratch slot before its owner has reduced it, or a rank
    //! can reduce or finish before its data is there.
    use super::*;
    use std::collections::HashMap;

    /// Addresses: rank q's buffer at q << 32, its scratch at (q << 32) | 1 << 31; memory is
    /// one f64 per 8-byte word.
    const SCRATCH: u64 = 1 << 31;

    /// Rank `rank` of `n`, every rank's scratch at its made-up address.
    fn layout(rank: usize, n: usize) -> Layout {
        let mut scratch = [0; MAX_RANKS];
        for (q, s) in scratch.iter_mut().enumerate().take(n) {
            *s = ((q as u64) << 32) | SCRATCH;
        }
        Layout {
            rank,
            nranks: n,
            arena: [0; MAX_RANKS],
            half: 0,
            scratch,
            scratch_bytes: 0,
            ll: [0; MAX_RANKS],
            ll_slot: 0,
        }
    }

    /// Every rank's buffer at its made-up address.
    fn buffers(n: usize) -> [u64; MAX_RANKS] {
        let mut buf = [0; MAX_RANKS];
        for (q, b) in buf.iter_mut().enumerate().take(n) {
            *b = (q as u64) << 32;
        }
        buf
    }

    struct Rank {
        lanes: HashMap<Lane, Vec<Item>>,
        pos: HashMap<Lane, usize>,
        /// Flag words: (kind, source) -> value.
        flags: HashMap<(u8, usize), u64>,
        base: u64,
    }

    #[derive(Debug, Clone)]
    enum Item {
        Step(Step),
        /// Mark `id` reached.
        Mark(usize),
        /// Wait until mark `id` is reached (on the lane that sets it).
        WaitMark(usize),
    }

    struct Model {
        ranks: Vec<Rank>,
        mem: HashMap<u64, f64>,
        marks: Vec<Vec<bool>>,
    }

    impl Model {
        fn word(&self, a: u64) -> f64 {
            *self.mem.get(&a).unwrap_or(&f64::NAN)
        }

        /// Runs step `i` of lane `l` of rank `r` if it can; true if it did.
        fn try_step(&mut self, r: usize, l: Lane) -> bool {
            let at = self.ranks[r].pos[&l];
            let Some(item) = self.ranks[r].lanes[&l].get(at).cloned() else {
                return false;
            };
            let n = self.ranks.len();
            match item {
                Item::Mark(id) => self.marks[r][id] = true,
                Item::WaitMark(id) => {
                    if !self.marks[r][id] {
                        return false;
                    }
                }
                Item::Step(Step::Copy { dst, src, len, .. }) => {
                    for w in 0..(len / 8) as u64 {
                        let v = self.word(src + 8 * w);
                        self.mem.insert(dst + 8 * w, v);
                    }
                }
                Item::Step(Step::Reduce { dst, srcs, len }) => {
                    for w in 0..(len / 8) as u64 {
                        let v: f64 = srcs.iter().map(|s| self.word(s + 8 * w)).sum();
                        self.mem.insert(dst + 8 * w, v);
                    }
                }
                Item::Step(Step::Sync {
                    signal,
                    wait,
                    advance,
                    ..
                }) => {
                    let base = self.ranks[r].base;
                    // The kernel signals, then waits; signalling again when a blocked wait is
                    // retried changes nothing.
                    if let Some((kind, v)) = signal {
                        for q in (0..n).filter(|&q| q != r) {
                            let f = self.ranks[q].flags.entry((kind as u8, r)).or_insert(0);
                            *f = (*f).max(base + v);
                        }
                    }
                    if let Some((kind, v)) = wait {
                        let flags = &self.ranks[r].flags;
                        let arrived = |q| flags.get(&(kind as u8, q)).copied().unwrap_or(0);
                        if !(0..n).filter(|&q| q != r).all(|q| arrived(q) >= base + v) {
                            return false;
                        }
                    }
                    self.ranks[r].base += advance;
                }
                Item::Step(Step::Order { .. }) => unreachable!("split into marks"),
            }
            *self.ranks[r].pos.get_mut(&l).expect("lane") += 1;
            true
        }
    }

    fn lanes_of(steps: &[Step], marks: &mut usize) -> HashMap<Lane, Vec<Item>> {
        let mut lanes: HashMap<Lane, Vec<Item>> = HashMap::new();
        for l in [Lane::Main, Lane::Scatter, Lane::Reduce, Lane::Gather] {
            lanes.insert(l, Vec::new());
        }
        for s in steps {
            match s {
                Step::Order { from, to } => {
                    lanes.get_mut(from).expect("lane").push(Item::Mark(*marks));
                    lanes
                        .get_mut(to)
                        .expect("lane")
                        .push(Item::WaitMark(*marks));
                    *marks += 1;
                }
                Step::Sync { lane, .. } | Step::Copy { lane, .. } => lanes
                    .get_mut(lane)
                    .expect("lane")
                    .push(Item::Step(s.clone())),
                Step::Reduce { .. } => lanes
                    .get_mut(&Lane::Reduce)
                    .expect("lane")
                    .push(Item::Step(s.clone())),
            }
        }
        lanes
    }

    /// Runs `ops` all_reduces of `words` f64 per rank on `n` ranks in chunks of `chunk` bytes
    /// with `slots` slots, in an interleaving drawn from `seed`; returns every rank's final
    /// buffer.
    fn run(
        n: usize,
        words: usize,
        (chunk, slots): (usize, usize),
        ops: usize,
        seed: u64,
    ) -> Vec<Vec<f64>> {
        let bytes = words * 8;
        let slice = two_shot_slice(bytes, n, 0).1;
        let k = Chunking {
            bounds: (0..slice)
                .step_by(chunk)
                .map(|at| (at, chunk.min(slice - at)))
                .collect(),
            slot_bytes: chunk,
            slots,
        };
        let all_reduce = |q: usize| schedule(&layout(q, n), &buffers(n), bytes, &k);
        run_ops(
            n,
            words,
            &vec![&all_reduce as &dyn Fn(usize) -> Vec<Step>; ops],
            seed,
        )
    }

    /// Runs `ops` (each gives rank q's steps) on `n` ranks of `words` f64 each, in an
    /// interleaving drawn from `seed`; returns every rank's final buffer.
    fn run_ops(
        n: usize,
        words: usize,
        ops: &[&dyn Fn(usize) -> Vec<Step>],
        seed: u64,
    ) -> Vec<Vec<f64>> {
        let buf = buffers(n);
        let mut model = Model {
            ranks: Vec::new(),
            mem: HashMap::new(),
            marks: vec![Vec::new(); n],
        };
        for (q, &start) in buf.iter().enumerate().take(n) {
            for w in 0..words as u64 {
                // Distinct per rank and word, exact in f64 sums.
                model
                    .mem
                    .insert(start + 8 * w, (q * 1000 + w as usize) as f64);
            }
            let mut marks = 0;
            let mut lanes: HashMap<Lane, Vec<Item>> = HashMap::new();
            for op in ops {
                for (l, items) in lanes_of(&op(q), &mut marks) {
                    lanes.entry(l).or_default().extend(items);
                }
            }
            model.marks[q] = vec![false; marks];
            model.ranks.push(Rank {
                pos: lanes.keys().map(|l| (*l, 0)).collect(),
                lanes,
                flags: HashMap::new(),
                base: 0,
            });
        }
        let mut rng = seed | 1;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let all: Vec<(usize, Lane)> = (0..n)
            .flat_map(|q| [Lane::Main, Lane::Scatter, Lane::Reduce, Lane::Gather].map(|l| (q, l)))
            .collect();
        loop {
            let runnable: Vec<(usize, Lane)> = all
                .iter()
                .copied()
                .filter(|&(q, l)| model.ranks[q].pos[&l] < model.ranks[q].lanes[&l].len())
                .collect();
            if runnable.is_empty() {
                break;
            }
            // Try lanes from a random start until one moves; none moving is a deadlock.
            let start = (next() % runnable.len() as u64) as usize;
            let moved = (0..runnable.len()).any(|i| {
                let (q, l) = runnable[(start + i) % runnable.len()];
                model.try_step(q, l)
            });
            assert!(moved, "deadlock: no lane of any rank can move");
        }
        (0..n)
            .map(|q| {
                (0..words as u64)
                    .map(|w| model.word(buf[q] + 8 * w))
                    .collect()
            })
            .collect()
    }

    fn expected(n: usize, words: usize, ops: u32) -> Vec<f64> {
        // Each op sums the ranks' buffers, which are then equal: op 1 gives S, op k gives
        // n^(k-1) S.
        (0..words)
            .map(|w| {
                let s: f64 = (0..n).map(|q| (q * 1000 + w) as f64).sum();
                s * (n as f64).powi(ops as i32 - 1)
            })
            .collect()
    }

    #[test]
    fn sums_are_right_on_every_rank_under_random_interleavings() {
        for (n, words, chunk) in [
            (2, 64, (64, 2)),
            (2, 61, (48, 2)),
            (2, 200, (16, 5)),
            (3, 100, (32, 2)),
            (3, 400, (64, 3)),
            (4, 37, (16, 3)),
            (8, 200, (80, 2)),
        ] {
            for seed in 1..40u64 {
                let out = run(n, words, chunk, 3, seed * 0x9E37_79B9);
                let want = expected(n, words, 3);
                for (q, got) in out.iter().enumerate() {
                    assert_eq!(
                        got, &want,
                        "n={n} words={words} chunk, slots={chunk:?} seed={seed} rank {q}"
                    );
                }
            }
        }
    }

    #[test]
    fn broadcasts_between_all_reduces_leave_every_rank_the_roots_buffer() {
        for (n, words) in [(2, 64), (3, 40), (4, 7)] {
            let bytes = words * 8;
            let k = chunking(bytes, n, 64 * words, 32).expect("fits");
            let all_reduce = |q: usize| schedule(&layout(q, n), &buffers(n), bytes, &k);
            let from = |root: usize| {
                move |q: usize| broadcast_schedule(&layout(q, n), &buffers(n), bytes, root)
            };
            let (b1, b0) = (from(1), from(0));
            let ops: [&dyn Fn(usize) -> Vec<Step>; 4] = [&b1, &all_reduce, &b0, &all_reduce];
            // Broadcasting rank 1's words, then summing: n copies of them; again after the
            // second broadcast (every buffer equal): n times that.
            let want: Vec<f64> = (0..words)
                .map(|w| (1000 + w) as f64 * (n * n) as f64)
                .collect();
            for seed in 1..40u64 {
                let out = run_ops(n, words, &ops, seed * 0x9E37_79B9);
                for (q, got) in out.iter().enumerate() {
                    assert_eq!(got, &want, "n={n} words={words} seed={seed} rank {q}");
                }
            }
        }
    }

    #[test]
    fn a_buffer_shorter_than_the_ranks_leaves_empty_slices_consistent() {
        // 3 words over 4 ranks: the last slices are empty, yet every rank runs the same chunks.
        for seed in 1..20u64 {
            let out = run(4, 3, (16, 2), 2, seed);
            let want = expected(4, 3, 2);
            assert!(out.iter().all(|got| got == &want), "seed {seed}");
        }
    }

    #[test]
    fn chunks_are_large_but_at_least_two_per_slice_and_fit_the_scratch() {
        let mib = 1 << 20;
        let sizes = |k: &Chunking| k.bounds.iter().map(|b| b.1 / mib).collect::<Vec<_>>();
        // 2 ranks, 1 GiB: slices of 512 MiB in 64 MiB chunks; the scratch holds two slots.
        let k = chunking(1 << 30, 2, 128 * mib, 0).expect("fits");
        assert_eq!(sizes(&k), [64; 8]);
        assert_eq!((k.slot_bytes, k.slots), (64 * mib, 2));
        // 128 MiB: slices of 64 MiB in two chunks.
        let k = chunking(128 * mib, 2, 128 * mib, 0).expect("fits");
        assert_eq!(sizes(&k), [32, 32]);
        assert_eq!(k.slots, 4);
        // 4 ranks, 64 MiB of scratch: slots of 64 / (2 x 3) MiB, rounded to whole vectors;
        // the last chunk is what is left.
        let k = chunking(1 << 30, 4, 64 * mib, 0).expect("fits");
        assert_eq!(k.slot_bytes, (64 * mib / 6) / 16 * 16);
        assert_eq!(k.slots, 2);
        let mut at = 0;
        for &(off, len) in &k.bounds {
            assert_eq!(off, at);
            assert!(len <= k.slot_bytes && len > 0);
            at += len;
        }
        assert_eq!(at, 256 * mib);
        // An asked size is rounded to whole vectors.
        let k = chunking(mib, 2, 64 * mib, 1000).expect("fits");
        assert_eq!(k.slot_bytes, 1008);
        assert_eq!(chunking(mib, 1, 64 * mib, 0), None);
        assert_eq!(chunking(mib, 2, 16, 0), None);
        assert_eq!(chunking(0, 2, 64 * mib, 0).expect("fits").bounds, []);
    }

    #[test]
    fn copies_only_write_peers_and_read_this_rank() {
        let k = Chunking {
            bounds: (0..1024).step_by(256).map(|at| (at, 256)).collect(),
            slot_bytes: 256,
            slots: 2,
        };
        for s in schedule(&layout(1, 4), &buffers(4), 4096, &k) {
            if let Step::Copy { src, dst, .. } = s {
                assert_eq!(src >> 32, 1, "reads only this rank's buffer");
                assert_ne!(dst >> 32, 1, "writes only peers");
            }
        }
    }
}
