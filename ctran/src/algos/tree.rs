//! Binomial trees rooted at any rank, shared by the tree algorithms of several collectives.

/// Position of `rank` in a binomial tree over `size` ranks rooted at `root`.
#[derive(Debug, Clone)]
pub struct BinomialTree {
    /// Parent rank, `None` at the root.
    pub parent: Option<usize>,
    /// Children, largest subtree first.
    pub children: Vec<usize>,
}

impl BinomialTree {
    /// The tree seen from `rank`.
    pub fn new(rank: usize, size: usize, root: usize) -> BinomialTree {
        let vr = (rank + size - root) % size;
        let real = |v: usize| (v + root) % size;
        let parent = (vr != 0).then(|| real(vr - (vr & vr.wrapping_neg())));
        let mut children = Vec::new();
        let mut mask = 1;
        while mask < size {
            if vr & mask != 0 {
                break;
            }
            if vr + mask < size {
                children.push(real(vr + mask));
            }
            mask <<= 1;
        }
        children.reverse();
        BinomialTree { parent, children }
    }
}

/// Rank `rank` relative to `root` (the root is 0).
pub fn vrank(rank: usize, size: usize, root: usize) -> usize {
    (rank + size - root) % size
}

/// Number of ranks in the subtree of relative rank `vr`: relative ranks `vr..vr + subtree`.
pub fn subtree(vr: usize, size: usize) -> usize {
    if vr == 0 {
        size
    } else {
        (vr & vr.wrapping_neg()).min(size - vr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_but_root_has_one_parent_that_lists_it() {
        for size in 1..=17 {
            for root in 0..size {
                let trees: Vec<_> = (0..size)
                    .map(|r| BinomialTree::new(r, size, root))
                    .collect();
                assert!(trees[root].parent.is_none());
                for r in (0..size).filter(|&r| r != root) {
                    let p = trees[r].parent.expect("non-root has a parent");
                    assert!(
                        trees[p].children.contains(&r),
                        "size {size} root {root} rank {r}"
                    );
                }
                let edges: usize = trees.iter().map(|t| t.children.len()).sum();
                assert_eq!(edges, size - 1);
            }
        }
    }

    #[test]
    fn subtrees_partition_their_parent() {
        for size in 1..=17 {
            for root in 0..size {
                for r in 0..size {
                    let t = BinomialTree::new(r, size, root);
                    let vr = vrank(r, size, root);
                    let kids: usize = t
                        .children
                        .iter()
                        .map(|&c| subtree(vrank(c, size, root), size))
                        .sum();
                    assert_eq!(kids + 1, subtree(vr, size), "size {size} root {root} r {r}");
                    for &c in &t.children {
                        let vc = vrank(c, size, root);
                        assert!(vc > vr && vc + subtree(vc, size) <= vr + subtree(vr, size));
                    }
                }
            }
        }
    }
}
