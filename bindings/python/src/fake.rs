//! The `fake` backend (upstream's `TorchCommFake`): rank 0 of 1, every operation is a no-op
//! that returns a completed work. Tests of the Python surface (hooks, options, backend
//! discovery) use it without a launcher or a store: `new_comm("fake", "cpu", name="t")`.
//!
//! It is a real `torchcomms::Backend`, so every call still goes through the API's argument
//! checks, the hooks and the op id counter; only the data does not move.

use std::sync::Arc;

use torchcomms::{Backend, Call, CommOptions, Device, InitArgs, OpOptions, Result, Work};

/// The name users pass to `new_comm`.
pub(crate) const NAME: &str = "fake";

/// One fake communicator.
#[derive(Debug)]
pub(crate) struct FakeBackend {
    name: String,
    device: Device,
}

impl FakeBackend {
    fn create(args: &InitArgs) -> FakeBackend {
        FakeBackend {
            name: args.name.clone(),
            device: args.device,
        }
    }
}

/// Registers `fake` with the backend registry (called when `torchcomms._comms` is imported,
/// as upstream's static initializer does).
pub(crate) fn register() {
    torchcomms::register_backend(
        NAME,
        Arc::new(|args: &InitArgs| Ok(Box::new(FakeBackend::create(args)) as Box<dyn Backend>)),
    );
}

impl Backend for FakeBackend {
    fn backend_name(&self) -> &str {
        NAME
    }
    fn version(&self) -> Result<String> {
        Ok(format!("fake {}", env!("CARGO_PKG_VERSION")))
    }
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn comm_name(&self) -> &str {
        &self.name
    }
    fn device(&self) -> Device {
        self.device
    }
    fn run(&self, _: Call, _: &OpOptions) -> Result<Work> {
        Ok(Work::completed())
    }
    fn split(
        &self,
        ranks: &[usize],
        name: &str,
        _options: CommOptions,
    ) -> Result<Option<Box<dyn Backend>>> {
        Ok((!ranks.is_empty()).then(|| {
            Box::new(FakeBackend {
                name: name.to_string(),
                device: self.device,
            }) as Box<dyn Backend>
        }))
    }
    fn finalize(&self) -> Result<()> {
        Ok(())
    }
    /// Upstream's fake ignores `abort()` (and says abort is not supported).
    fn abort(&self) -> Result<()> {
        Ok(())
    }
}
