//! Where tokens go: which ranks hold a token's top-k experts, the byte layout of the records
//! dispatch and combine send, and the expert-major order of the rows a rank receives.

/// The bytes of one dispatched token: its activations (BF16, or FP8 and a scale), its index on
/// the sending rank, and per top-k slot the receiving rank's local expert (-1 where the slot's
/// expert lives elsewhere) and the slot's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DispatchRecord {
    /// Bytes of the activations.
    pub payload: usize,
    /// Whether a 4-byte scale follows the activations.
    pub scaled: bool,
    /// Top-k slots.
    pub top_k: usize,
}

impl DispatchRecord {
    pub(crate) fn new(hidden: usize, fp8: bool, top_k: usize) -> DispatchRecord {
        DispatchRecord {
            payload: if fp8 { hidden } else { hidden * 2 },
            scaled: fp8,
            top_k,
        }
    }

    /// Where the scale sits.
    pub(crate) fn scale_at(&self) -> usize {
        self.payload
    }

    /// Where the token index sits.
    pub(crate) fn token_at(&self) -> usize {
        self.payload + if self.scaled { 4 } else { 0 }
    }

    /// Where slot `k`'s (local expert, weight) pair sits.
    pub(crate) fn slot_at(&self, k: usize) -> usize {
        self.token_at() + 4 + 8 * k
    }

    /// Bytes of one record.
    pub(crate) fn bytes(&self) -> usize {
        self.slot_at(self.top_k)
    }
}

/// The bytes of one combined row: an expert's output for a token, the token's index on the
/// rank it came from, and the top-k slot it answers.
pub(crate) fn combine_record_bytes(hidden: usize) -> usize {
    hidden * 2 + 8
}

/// A bad expert id: token, slot and the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadExpert {
    pub token: usize,
    pub slot: usize,
    pub id: i64,
}

/// Per destination rank, the tokens with at least one top-k expert there, ascending. Ids are
/// in `[0, num_experts)`, or -1 for an unused slot; a token names an expert at most once.
pub(crate) fn ranks_of_tokens(
    topk_idx: &[i64],
    top_k: usize,
    num_experts: usize,
    size: usize,
) -> Result<Vec<Vec<u32>>, BadExpert> {
    let per_rank = num_experts / size;
    let mut to: Vec<Vec<u32>> = vec![Vec::new(); size];
    for (token, row) in topk_idx.chunks_exact(top_k).enumerate() {
        let mut last = usize::MAX;
        let mut ranks: Vec<usize> = Vec::with_capacity(top_k);
        for (slot, &id) in row.iter().enumerate() {
            if id == -1 {
                continue;
            }
            if id < 0 || id as u64 >= num_experts as u64 || row[..slot].contains(&id) {
                return Err(BadExpert { token, slot, id });
            }
            ranks.push(id as usize / per_rank);
        }
        ranks.sort_unstable();
        for r in ranks {
            if r != last {
                to[r].push(token as u32);
                last = r;
            }
        }
    }
    Ok(to)
}

/// One row a rank received, in expert-major order: where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSource {
    /// The rank that dispatched the token.
    pub rank: u32,
    /// The token's index on that rank.
    pub token: u32,
    /// The top-k slot this row answers.
    pub slot: u32,
}

/// Received records grouped by local expert: per expert, `(record index, slot)` in order of
/// source rank, then token.
pub(crate) fn group_by_expert(
    slots: impl Iterator<Item = (usize, usize, i32)>,
    local_experts: usize,
) -> Vec<Vec<(usize, usize)>> {
    let mut groups = vec![Vec::new(); local_experts];
    for (record, slot, expert) in slots {
        if let Ok(e) = usize::try_from(expert) {
            if e < local_experts {
                groups[e].push((record, slot));
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_once_to_each_rank_of_its_experts() {
        // 8 experts on 4 ranks (2 each); 3 tokens, top-3.
        let idx = [0, 1, 5, /**/ -1, 7, 6, /**/ -1, -1, -1];
        let to = ranks_of_tokens(&idx, 3, 8, 4).unwrap();
        assert_eq!(to, vec![vec![0], vec![], vec![0], vec![1]]);
        let bad = ranks_of_tokens(&[0, 8], 2, 8, 4).unwrap_err();
        assert_eq!(
            bad,
            BadExpert {
                token: 0,
                slot: 1,
                id: 8
            }
        );
        assert!(ranks_of_tokens(&[-2], 1, 8, 4).is_err());
        let twice = ranks_of_tokens(&[3, -1, 3], 3, 8, 4).unwrap_err();
        assert_eq!((twice.slot, twice.id), (2, 3));
    }

    #[test]
    fn record_layout() {
        let r = DispatchRecord::new(16, true, 2);
        assert_eq!(
            (r.scale_at(), r.token_at(), r.slot_at(1), r.bytes()),
            (16, 20, 32, 40)
        );
        let r = DispatchRecord::new(16, false, 2);
        assert_eq!((r.token_at(), r.bytes()), (32, 52));
    }

    #[test]
    fn groups_keep_arrival_order_and_drop_foreign_slots() {
        let g = group_by_expert(
            [(0, 0, 1), (0, 1, -1), (1, 0, 0), (2, 1, 1), (3, 0, 9)].into_iter(),
            2,
        );
        assert_eq!(g, vec![vec![(1, 0)], vec![(0, 0), (2, 1)]]);
    }
}
