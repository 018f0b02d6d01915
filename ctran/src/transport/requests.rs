//! The requests of one transport, from posting until its owner learns how each ended: the
//! bookkeeping every transport keeps alike (ids, the peer of each pending request, finished
//! and failed ones awaiting [`Transport::test`](crate::transport::Transport::test)).

use std::collections::{HashMap, HashSet};

use super::{ReqId, TransportError};

/// Posted requests and their outcomes.
#[derive(Debug)]
pub(crate) struct Requests {
    next_id: u64,
    /// Pending request → its peer.
    pending: HashMap<u64, usize>,
    done: HashSet<u64>,
    failed: HashMap<u64, TransportError>,
}

impl Requests {
    /// No requests; ids start at `first_id` (transports a mapper combines use apart ranges).
    pub(crate) fn new(first_id: u64) -> Requests {
        Requests {
            next_id: first_id,
            pending: HashMap::new(),
            done: HashSet::new(),
            failed: HashMap::new(),
        }
    }

    /// A new pending request to `peer`.
    pub(crate) fn open(&mut self, peer: usize) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.pending.insert(id, peer);
        id
    }

    /// Marks `id` finished; false if it was not pending.
    pub(crate) fn finish(&mut self, id: u64) -> bool {
        let was = self.pending.remove(&id).is_some();
        if was {
            self.done.insert(id);
        }
        was
    }

    /// Marks `id` failed with `e`; false if it was not pending.
    pub(crate) fn fail(&mut self, id: u64, e: TransportError) -> bool {
        let was = self.pending.remove(&id).is_some();
        if was {
            self.failed.insert(id, e);
        }
        was
    }

    /// Fails every pending request whose peer `which` selects.
    pub(crate) fn fail_where(&mut self, which: impl Fn(usize) -> bool, e: &TransportError) {
        let ids: Vec<u64> = self
            .pending
            .iter()
            .filter(|&(_, &peer)| which(peer))
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.fail(id, e.clone());
        }
    }

    /// Whether `id` is posted and unfinished.
    pub(crate) fn is_pending(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
    }

    /// Whether any request is posted and unfinished.
    pub(crate) fn any_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Unfinished requests.
    pub(crate) fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// The peer of pending request `id`.
    pub(crate) fn peer_of(&self, id: u64) -> Option<usize> {
        self.pending.get(&id).copied()
    }

    /// How `id` ended, reported once: `Some(Ok(()))` finished, `Some(Err(_))` failed, `None`
    /// still pending or unknown.
    pub(crate) fn take_outcome(&mut self, id: u64) -> Option<Result<(), TransportError>> {
        if self.done.remove(&id) {
            return Some(Ok(()));
        }
        self.failed.remove(&id).map(Err)
    }

    /// [`Transport::test`](crate::transport::Transport::test) for a transport that fails
    /// pending requests as `Aborted` once `aborted`.
    pub(crate) fn test(&mut self, req: ReqId, aborted: bool) -> Result<bool, TransportError> {
        if let Some(outcome) = self.take_outcome(req.0) {
            return outcome.map(|()| true);
        }
        if self.is_pending(req.0) {
            if aborted {
                return Err(TransportError::Aborted);
            }
            return Ok(false);
        }
        // Unknown ids were already reported finished; asking again is an engine bug.
        debug_assert!(false, "test() of unknown request {req:?}");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_reported_once() {
        let mut r = Requests::new(7);
        let (a, b, c) = (r.open(0), r.open(1), r.open(1));
        assert_eq!((a, b, c), (7, 8, 9));
        assert_eq!(r.test(ReqId(a), false), Ok(false));
        assert!(r.finish(a));
        assert!(!r.finish(a));
        assert_eq!(r.test(ReqId(a), false), Ok(true));
        r.fail_where(|p| p == 1, &TransportError::Aborted);
        assert!(!r.any_pending());
        assert_eq!(r.take_outcome(b), Some(Err(TransportError::Aborted)));
        assert_eq!(r.take_outcome(b), None);
        let d = r.open(2);
        assert_eq!(r.peer_of(d), Some(2));
        assert_eq!(r.test(ReqId(d), true), Err(TransportError::Aborted));
        assert_eq!(r.pending_count(), 1);
    }
}
