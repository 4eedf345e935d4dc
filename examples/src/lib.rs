//! Shared code of the tickmark examples.

pub mod existing_app;
pub mod logging;
pub mod payments;
pub mod secrets;
pub mod shopsync;
pub mod shutdown;
pub mod stripe_signature;
