//! The cost model's calibration, driven from the thread that creates the communicator: every
//! step goes to the progress thread and back through the same queue, wake-up and completion
//! signal as the caller's operations, so the times it fits include what those pay.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::executor::Command;
use super::{Comm, Request};
use crate::algos::ctx::OpCtx;
use crate::algos::select::calibrate::{self, Steps};
use crate::error::{Error, Result};

/// [`Steps`] over a communicator's progress thread.
struct CallerSteps<'a> {
    comm: &'a Comm,
}

impl Steps for CallerSteps<'_> {
    fn rank_size(&self) -> (usize, usize) {
        (self.comm.rank(), self.comm.size())
    }

    fn run<T: Send + 'static>(
        &mut self,
        step: impl FnOnce(&mut OpCtx<'_>) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let shared = &self.comm.shared;
        let request = Request::new("calibrate", 0, shared.wait_spin);
        let out = Arc::new(Mutex::new(None));
        let (done, put) = (request.clone(), Arc::clone(&out));
        let command = Command::Step(Box::new(move |cx| {
            let result = step(cx).map(|value| {
                *put.lock().unwrap_or_else(|p| p.into_inner()) = Some(value);
            });
            done.finish(result.clone());
            result
        }));
        if !self.comm.send_command(command) {
            return Err(Error::NotSupported(
                "calibrating after the progress thread stopped".into(),
            ));
        }
        // The step's operations have the selector's deadline; the extra second only covers a
        // wedged thread.
        let wait = shared.selector.timeout + Duration::from_secs(1);
        request.wait_timeout(wait, shared.rank)?;
        let value = out.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(value.expect("a step that succeeded left its value"))
    }
}

/// Measures and agrees on the cost model with every other rank, before the communicator's first
/// operation; a failure has failed the communicator (its first operation reports it).
pub(super) fn calibrate(comm: &Comm) {
    let shared = &comm.shared;
    let sel = &shared.selector;
    let mut steps = CallerSteps { comm };
    let local_tcp = !comm.config().use_shm;
    match calibrate::run(&mut steps, &sel.config().cost, shared.host_cores, local_tcp) {
        Ok(model) => sel.set_model(model),
        Err(e) => tracing::debug!(rank = shared.rank, "calibration failed: {e}"),
    }
}
