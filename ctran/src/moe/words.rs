//! The mapped host words the MoE kernels share with the host (`kernels/report.cuh`): where
//! they report an error, and what tells their waits that the communicator aborted.

use std::sync::Arc;
use std::time::Duration;

use crate::cuda::error::Result;
use crate::cuda::{Context, PinnedBuffer};
use crate::error::Error;

/// Code of a wait that reached the timeout (`DEV_ERR_TIMEOUT`).
const ERR_TIMEOUT: u64 = 2;
/// Code of a wait that saw the abort word (`DEV_ERR_ABORTED`).
const ERR_ABORTED: u64 = 7;

/// A word that the kernels' waits poll: raised once the communicator aborts, so a kernel
/// waiting for a peer gives up at once instead of at the timeout.
#[derive(Debug)]
pub struct AbortWord(PinnedBuffer);

impl AbortWord {
    /// A lowered word on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<AbortWord>> {
        PinnedBuffer::alloc(ctx, 8).map(|b| Arc::new(AbortWord(b)))
    }

    /// Raises it: every wait of every kernel given it fails.
    pub fn raise(&self) {
        // SAFETY: 8 bytes of pinned memory, 8-aligned; the kernels only read it.
        unsafe { self.0.as_ptr().cast::<u64>().write_volatile(1) };
    }

    /// Its device address, for the kernels.
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }
}

/// One device error: its code and three details (what they mean depends on the code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceError {
    /// The kernel source's code (1 and up).
    pub code: u64,
    /// The details.
    pub detail: [u64; 3],
}

impl DeviceError {
    /// The error of a wait that gave up, if this is one. `what` names the operation by the
    /// wait's "what waited" detail; `rank`, `comm` and `timeout` are this rank's.
    pub fn wait_error(
        &self,
        what: impl Fn(u64) -> String,
        rank: usize,
        comm: &str,
        timeout: Duration,
    ) -> Option<Error> {
        let [peer, waited, round] = self.detail;
        match self.code {
            ERR_TIMEOUT => Some(Error::Timeout {
                op: what(waited),
                seq: round,
                rank,
                peer: Some(peer as usize),
                timeout,
            }),
            ERR_ABORTED => Some(Error::Aborted {
                comm: comm.to_string(),
                reason: format!(
                    "{} waiting for rank {peer} gave up: the communicator aborted",
                    what(waited)
                ),
            }),
            _ => None,
        }
    }
}

/// Which errors a slot of [`ErrorWords`] holds (`DEV_SLOT_*` in `kernels/report.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Errors in this rank's own input, after which the exchange completed.
    Input = 0,
    /// Errors that broke the exchange: a wait that timed out or saw the abort, a peer's count
    /// out of range.
    Exchange = 1,
}

/// Where the kernels report errors: per [`Slot`], the first (a code, then three details).
#[derive(Debug)]
pub struct ErrorWords(PinnedBuffer);

impl ErrorWords {
    /// Cleared words on `ctx`'s device.
    pub fn new(ctx: &Arc<Context>) -> Result<ErrorWords> {
        PinnedBuffer::alloc(ctx, 64).map(ErrorWords)
    }

    /// Their device address, for the kernels.
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }

    /// The pending error of either slot, cleared: this rank's input first (the likelier cause
    /// of a peer's failure), then the exchange's.
    pub fn take(&self) -> Option<DeviceError> {
        self.take_slot(Slot::Input)
            .or_else(|| self.take_slot(Slot::Exchange))
    }

    /// The first error reported into `slot` since it was last taken, cleared.
    pub fn take_slot(&self, slot: Slot) -> Option<DeviceError> {
        // SAFETY: eight u64 words of pinned memory (64 bytes, 8-aligned), four per slot, that
        // the device writes with system-scope stores; volatile reads see them.
        let words = unsafe { self.0.as_ptr().cast::<u64>().add(4 * slot as usize) };
        // SAFETY: as above.
        let [code, a, b, c] = std::array::from_fn(|i| unsafe { words.add(i).read_volatile() });
        if code == 0 {
            return None;
        }
        // SAFETY: as above; clearing lets the slot's next error through.
        (0..4).for_each(|i| unsafe { words.add(i).write_volatile(0) });
        Some(DeviceError {
            code,
            detail: [a, b, c],
        })
    }
}
