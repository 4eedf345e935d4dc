//! The harness of tickmark's fuzz targets: see [`harness`] and `docs/fuzzing.md`.

pub mod harness;

pub use harness::{
    check, check_dedup_key, check_plan, run_target, AnyDelivery, FuzzDelivery, Scheme,
};
