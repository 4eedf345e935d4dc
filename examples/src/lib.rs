//! Shared code of the tickmark examples.
