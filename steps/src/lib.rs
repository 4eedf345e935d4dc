//! Ready-made steps for tickmark.
