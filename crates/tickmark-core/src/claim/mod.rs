//! Claims and leases: which events this worker holds, and the heartbeat that
//! keeps them. The claim itself is one store call (`Store::event_claim_many`).

mod heartbeat;
mod lease_book;

pub use heartbeat::heartbeat_loop;
pub use lease_book::{HeldLease, LeaseBook};
