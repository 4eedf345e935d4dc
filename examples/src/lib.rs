//! Shared code of the tickmark examples.

pub mod bench;
pub mod fleet;
pub mod payments;
pub mod secrets;
pub mod shopsync;
pub mod shutdown;
pub mod soak;
pub mod stripe_signature;
