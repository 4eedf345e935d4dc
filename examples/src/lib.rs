//! Shared code of the tickmark examples.

pub mod bench;
pub mod existing_app;
pub mod fleet;
pub mod logging;
pub mod payments;
pub mod secrets;
pub mod shopsync;
pub mod shutdown;
pub mod soak;
pub mod stripe_signature;
