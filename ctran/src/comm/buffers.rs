//! Buffers registered with the transports that move data by DMA (ib), so that transfers from
//! and into them skip the transport's staging copies: the GPU progress engine's pinned staging,
//! which every GPU operation over host transports goes through.

use std::time::Duration;

use super::executor::Command;
use super::Comm;
use crate::error::{Error, Result};
use crate::span::Span;
use crate::transport::ib::UserDevice;
use crate::transport::Transport;

impl Comm {
    /// Registers `span`, memory of `device`, with the transports that can move it in place:
    /// `Ok(true)` if one did, `Ok(false)` if none moves data by DMA (TCP and shared memory
    /// copy anyway), or why registering failed (transfers then stage as before). Waits for
    /// the progress thread, so operations issued after it find the buffer registered.
    ///
    /// # Safety
    /// The memory must stay valid until [`Comm::deregister_buffer`] returned, or the
    /// communicator's progress thread has stopped.
    pub unsafe fn register_buffer(&self, span: Span, device: UserDevice) -> Result<bool> {
        if !self.config.want_ib {
            return Ok(false);
        }
        self.on_transports("registering a buffer", move |net| {
            net.register_buffer(span, &device)
                .map_err(|e| Error::NotSupported(e.to_string()))
        })?
    }

    /// Forgets a registration of [`Comm::register_buffer`]; once this returns, no transfer
    /// issued later uses it. Nothing to do once the progress thread has stopped (its
    /// transports are gone).
    pub fn deregister_buffer(&self, span: Span) {
        if !self.config.want_ib {
            return;
        }
        if let Err(e) = self.on_transports("deregistering a buffer", move |net| {
            net.deregister_buffer(span)
        }) {
            tracing::debug!(rank = self.rank(), "{e}");
        }
    }

    /// For every rank, whether transfers with it move registered buffers in place (ib carries
    /// them), so that a registered buffer may be GPU memory.
    pub fn in_place_peers(&self) -> Result<Vec<bool>> {
        let n = self.size();
        self.on_transports("asking which peers ib carries", move |net| {
            (0..n).map(|p| net.moves_in_place(p)).collect()
        })
    }

    /// How many transfers moved in place through registered buffers so far (diagnostics).
    pub fn moved_in_place(&self) -> Result<u64> {
        self.on_transports("counting transfers in place", |net| net.moved_in_place())
    }

    /// Runs `work` on the progress thread's transports between operations and waits for it.
    fn on_transports<T: Send + 'static>(
        &self,
        what: &str,
        work: impl FnOnce(&mut dyn Transport) -> T + Send + 'static,
    ) -> Result<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let command = Command::Net(Box::new(move |net| {
            let _ = tx.send(work(net));
        }));
        let gone = || Error::NotSupported(format!("{what} after the progress thread stopped"));
        if !self.send_command(command) {
            return Err(gone());
        }
        // The thread may be running earlier operations first, each bounded by its deadline.
        match rx.recv_timeout(self.config.timeout + Duration::from_secs(1)) {
            Ok(v) => Ok(v),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(gone()),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Err(Error::Timeout {
                op: what.into(),
                seq: 0,
                rank: self.rank(),
                peer: None,
                timeout: self.config.timeout,
            }),
        }
    }
}
