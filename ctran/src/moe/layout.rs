//! Where everything of a device MoE exchange lives: the symmetric region peers write (mapped
//! transport) and this rank's scratch, as byte offsets the kernels take in [`MoeLayout`]
//! (mirrored by the struct of the same name in `kernels/moe.cu`).

use crate::cuda::DeviceRepr;

/// The shape of one expert-parallel exchange, as the kernels see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeShape {
    /// This rank.
    pub rank: usize,
    /// Ranks.
    pub size: usize,
    /// Experts over all ranks.
    pub num_experts: usize,
    /// Elements per token (a multiple of 8).
    pub hidden: usize,
    /// The most tokens a rank dispatches at once.
    pub max_tokens: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Received rows are slabs per expert (`[local, size * max_tokens, hidden]`), not packed.
    pub low_latency: bool,
}

impl MoeShape {
    /// Experts per rank.
    pub fn local(&self) -> usize {
        self.num_experts / self.size
    }

    /// Rows of one expert's slab: every rank's every token.
    pub fn slab(&self) -> usize {
        self.size * self.max_tokens
    }

    /// Rows the received-row tensors must hold.
    pub fn recv_rows(&self) -> usize {
        if self.low_latency {
            self.local() * self.slab()
        } else {
            self.slab() * self.top_k.min(self.local())
        }
    }

    /// Bytes of one dispatch record: the activations (bf16, or FP8 with `fp8`), a scale, the
    /// token index and per slot a local expert and a weight; 16-byte aligned. Buffers are sized
    /// for bf16 records, so FP8 ones fit too (and a staged FP8 dispatch moves half the bytes).
    pub fn rec_stride(&self, fp8: bool) -> usize {
        let payload = if fp8 { self.hidden } else { 2 * self.hidden };
        (payload + 8 + 8 * self.top_k).next_multiple_of(16)
    }

    /// Bytes of one staged combine record: a bf16 row, the token and the slot.
    pub fn crec_stride(&self) -> usize {
        (2 * self.hidden + 8).next_multiple_of(16)
    }
}

// Fields mirror the CUDA struct of the same name in moe.cu, which documents them.
#[allow(missing_docs)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MoeLayout {
    pub drecv: u64,
    pub crecv: u64,
    pub dflag: u64,
    pub dcount: u64,
    pub dack: u64,
    pub cflag: u64,
    pub stamp: u64,
    pub state: u64,
    pub mask: u64,
    pub pos: u64,
    pub idx: u64,
    pub w: u64,
    pub send_counts: u64,
    pub send_off: u64,
    pub recv_counts: u64,
    pub ecnt: u64,
    pub elist: u64,
    pub eoff: u64,
    pub epos: u64,
    pub efirst: u64,
    pub rbase: u64,
    pub rows_per_src: u64,
    pub csend_off: u64,
    pub crecv_counts: u64,
    pub row_src: u64,
    pub send: u64,
    pub cstage: u64,
}

/// Bytes of the kernels' `MoeState`.
const STATE_BYTES: usize = 64;
/// Bytes of one `MoeRow`.
const ROW_BYTES: usize = 16;

/// Hands out 16-byte aligned offsets.
struct Bump(usize);

impl Bump {
    fn take(&mut self, bytes: usize) -> u64 {
        let at = self.0;
        self.0 = (self.0 + bytes).next_multiple_of(16);
        at as u64
    }
}

impl MoeLayout {
    /// The layout for `shape`, and the bytes of the symmetric region and of the scratch.
    pub fn new(s: &MoeShape) -> (MoeLayout, usize, usize) {
        let (size, t, k, local) = (s.size, s.max_tokens, s.top_k, s.local());
        let rows = s.recv_rows();
        let mut sym = Bump(0);
        let mut l = MoeLayout {
            drecv: sym.take(size * t * s.rec_stride(false)),
            crecv: sym.take(t * k * 2 * s.hidden),
            dflag: sym.take(size * 8),
            dcount: sym.take(size * 8),
            dack: sym.take(size * 8),
            cflag: sym.take(size * 8),
            stamp: sym.take(t * k * 4),
            ..MoeLayout::default()
        };
        let mut sc = Bump(0);
        l.state = sc.take(STATE_BYTES);
        l.mask = sc.take(t * 8);
        l.pos = sc.take(t * size * 4);
        l.idx = sc.take(t * k * 4);
        l.w = sc.take(t * k * 4);
        l.send_counts = sc.take(size * 8);
        l.send_off = sc.take(size * 8);
        l.recv_counts = sc.take(size * 8);
        l.ecnt = sc.take(local * size * 4);
        l.elist = sc.take(local * s.slab() * 8);
        l.eoff = sc.take((local + 1) * 4);
        l.epos = sc.take(local * size * 4);
        l.efirst = sc.take(local * size * 4);
        l.rbase = sc.take(size * 8);
        l.rows_per_src = sc.take(size * 8);
        l.csend_off = sc.take(size * 8);
        l.crecv_counts = sc.take(size * 8);
        l.row_src = sc.take(rows * ROW_BYTES);
        let send_records = t * k.min(size);
        l.send = sc.take((send_records * s.rec_stride(false)).max(rows * s.crec_stride()));
        l.cstage = sc.take(t * k * s.crec_stride());
        (l, sym.0, sc.0)
    }

    /// Bytes of the staged send buffer.
    pub fn send_bytes(s: &MoeShape) -> usize {
        (s.max_tokens * s.top_k.min(s.size) * s.rec_stride(false))
            .max(s.recv_rows() * s.crec_stride())
    }
}

// SAFETY: plain old data of u64 fields, laid out as the CUDA struct (repr(C)).
unsafe impl DeviceRepr for MoeLayout {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_do_not_overlap_and_are_aligned() {
        let s = MoeShape {
            rank: 1,
            size: 4,
            num_experts: 32,
            hidden: 7168,
            max_tokens: 128,
            top_k: 8,
            low_latency: true,
        };
        let (l, sym, scratch) = MoeLayout::new(&s);
        let sym_at = [
            l.drecv, l.crecv, l.dflag, l.dcount, l.dack, l.cflag, l.stamp,
        ];
        assert!(sym_at.windows(2).all(|w| w[0] < w[1]));
        assert!(sym_at.iter().all(|a| a % 16 == 0));
        assert!(l.stamp as usize + s.max_tokens * s.top_k * 4 <= sym);
        assert!(l.cstage as usize + s.max_tokens * s.top_k * s.crec_stride() <= scratch);
        assert_eq!((s.rec_stride(false) % 16, s.rec_stride(true) % 16), (0, 0));
        assert!(s.rec_stride(true) < s.rec_stride(false));
        assert_eq!(s.recv_rows(), 8 * 4 * 128);
    }
}
