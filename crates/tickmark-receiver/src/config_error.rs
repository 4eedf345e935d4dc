//! What can be wrong in a [`Receiver`](super::Receiver)'s configuration:
//! found by the builder method that sets it, returned as a `Result`, never
//! a panic.

use super::MAX_SOURCE_NAME_LEN;

/// A receiver's configuration is wrong. Each message says what to change.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiverConfigError {
    /// A source name is not a path segment tickmark accepts
    /// ([`Receiver::source`](super::Receiver::source)).
    #[error(
        "webhook source name `{name}` must be 1 to {MAX_SOURCE_NAME_LEN} ASCII letters, digits, \
         `_`, `-` or `.` (not first): it is a URL path segment and the events' source; rename it"
    )]
    InvalidSourceName {
        /// The name given.
        name: String,
    },
    /// A source name is mounted twice
    /// ([`Receiver::source`](super::Receiver::source)).
    #[error(
        "webhook source `{name}` is mounted twice: mount it once (one provider takes several \
         secrets during a rotation), or give the second one its own name, such as `{name}-2`"
    )]
    DuplicateSource {
        /// The repeated name.
        name: String,
    },
    /// A path template cannot route deliveries
    /// ([`Receiver::path`](super::Receiver::path)).
    #[error("webhook path template `{template}` {problem}: write it like `/webhooks/{{source}}`")]
    InvalidPathTemplate {
        /// The template given.
        template: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}
