//! Bootstrap: how ranks find each other before any data moves. A [`Store`] (usually the
//! [`TcpStore`](tcp_store) that torchrun serves) carries addresses and secrets; rank and size come
//! from the launcher's environment ([`env`]).

pub mod env;
mod hash_store;
pub mod rendezvous;
mod store;
pub mod tcp_store;

pub use hash_store::HashStore;
pub use store::{PrefixStore, Store};
