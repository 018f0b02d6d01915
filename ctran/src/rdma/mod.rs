//! One-sided transfers between any two processes: upstream torchcomms' RDMA transport API
//! (`torchcomms._transport`), in software.
//!
//! A process registers memory ([`RdmaMemory`]) and hands peers a [`RdmaRemoteBuffer`] (address,
//! length and an access key). Two [`RdmaTransport`]s connect point to point (each `bind()`s,
//! the URLs are exchanged out of band, each `connect()`s to the other), and then either side
//! writes its local views into the peer's remote buffers or reads them. There is no
//! InfiniBand here: within a host, host memory moves by cross-memory attach and CUDA memory by
//! CUDA IPC; otherwise the bytes travel over the connection's TCP stream. Whatever the path,
//! the process that owns the memory validates every request against its registry (the key is
//! a claim, not a capability) before it touches anything. See `docs/rdma.md`.

mod copy;
mod error;
mod ib_path;
mod key;
mod link;
mod peer_pid;
mod registry;
mod transport;
mod url;
mod wait;
pub(crate) mod wire;

pub use error::{RdmaError, Result};
pub use key::{host_id, process_nonce, AccessKey};
pub use registry::{
    MemDevice, RdmaMemory, RdmaMemoryMutableView, RdmaMemoryView, RdmaRemoteBuffer,
};
pub use transport::{DataPath, PathStats, RdmaTransport};
pub use url::PeerUrl;
