//! # tickmark-driver: the interface between tickmark's engine and its databases
//!
//! **Not for users.** Add [`tickmark`](https://docs.rs/tickmark) and reach
//! these types through it (`tickmark::Event`, `tickmark::StoreError`, …).
//! This crate is public only so that tickmark's own crates can share it: the
//! engine core (`tickmark-core`) calls the [`Store`] trait, each backend
//! (`tickmark-postgres`, `tickmark-sqlite`) implements it. Like River's
//! `riverdriver`, it is **outside semver**: any release may change it.
//!
//! What it holds, bottom up: the records of an event's life ([`event`]), the
//! rules read as the database reads them ([`ordering`], [`wait`], [`flow`],
//! [`retry`]), and the storage interface itself ([`store`]: the `Store` trait,
//! its parameter and row records, its errors, and what both backends share).
//! Nothing here knows SQL of one dialect, HTTP, plans or runners.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without a backend feature the driver still compiles (the core depends on
// it without one, and each crate is verified alone when packaged), but a
// step's transaction and portable queries have no database to run on: the
// facade refuses such a build with a `compile_error!`. Their code is then
// unused, which is not worth a warning.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite")),
    allow(dead_code, unused_imports, unreachable_code)
)]

pub mod dedup_key;
pub mod event;
pub mod flow;
pub mod jitter;
pub mod ordering;
pub mod retry;
pub mod store;
pub mod trace_context;
pub mod wait;

pub use event::{Event, EventState, NewEvent, StepState};
pub use retry::RetryPolicy;
pub use store::{Backend, StepTransaction, Store, StoreError};
pub use trace_context::TraceContext;
