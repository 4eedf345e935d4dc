//! The harness of tickmark's fuzz targets: see [`harness`] and `docs/fuzzing.md`;
//! the seed corpus they start from ([`seeds`], written as bytes by [`encode`]).

pub mod encode;
pub mod harness;
pub mod seeds;

pub use harness::{
    check, check_dedup_key, check_plan, run_target, AnyDelivery, FuzzDelivery, Scheme,
};
