//! Why an operator action was not done.

use tickmark_driver::store::StoreError;

/// Why an operator action was not done.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No such event.
    #[error("no event {0}; `tickmark events list` shows the events")]
    NotFound(String),
    /// The event's state does not allow the action; the message says what would.
    #[error("refused: {0}")]
    Refused(String),
    /// The event's plan has no step of that name.
    #[error("event {event_seq} has no step `{step}`; its steps are: {known}")]
    UnknownStep {
        /// The event.
        event_seq: i64,
        /// The name asked for.
        step: String,
        /// The names it has.
        known: String,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for AdminError {
    fn from(error: sqlx::Error) -> Self {
        AdminError::Store(error.into())
    }
}
