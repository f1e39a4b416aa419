//! What the running store holds in memory beside the B-tree: the overlay of acknowledged
//! changes and the writer's epochs, and the record cache ([`overlay`]), waiters for a
//! key ([`wait`]), the poison flag after a failed write ([`poison`]), the counters
//! ([`stats`]) and the settings the engine runs under ([`settings`]).

pub(crate) mod overlay;
pub(crate) mod poison;
pub(crate) mod settings;
pub(crate) mod stats;
pub(crate) mod wait;
