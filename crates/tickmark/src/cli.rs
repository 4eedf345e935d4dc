//! The `tickmark` operator command line, to embed in an application's own
//! binary with its handlers ([`main_with`]: `replan` needs them). The
//! `tickmark` binary is [`main`]. The guide is docs/operations.md.

pub use tickmark_cli::{main, main_with};
