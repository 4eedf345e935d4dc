//! Shared code of the tickmark examples.

pub mod payments;
