//! Bootstrap: how ranks find each other before any data moves. A [`Store`] (usually the
//! [`TcpStore`](tcp_store) that torchrun serves) carries addresses and public nonces (secrets derive from the job key, [`auth`]); rank and size come
//! from the launcher's environment ([`env`]).

pub mod auth;
pub mod bind;
pub mod env;
mod hash_store;
pub mod rendezvous;
mod store;
pub mod tcp_store;

pub use hash_store::HashStore;
pub use store::{PrefixStore, Store};
