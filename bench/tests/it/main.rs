//! tickmark-bench's integration tests, one binary (as in the other crates):
//! `cargo nextest run -p tickmark-bench --test it`.

mod soak;
