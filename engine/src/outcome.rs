//! What a step's run returns: an output, or a [`StepError`] that says whether
//! to retry, dead-letter, or run the step again later without spending an
//! attempt.

use std::fmt;
use std::time::Duration;

/// What a step returns: a JSON output (stored with its mark and handed to later
/// steps), or a [`StepError`].
pub type StepResult = Result<serde_json::Value, StepError>;

/// How a step failed: retryable (the default for `?`) or terminal.
///
/// `StepError` deliberately does not implement `std::error::Error`, so that
/// `?` can convert any error into it.
pub struct StepError {
    kind: FailureKind,
    message: String,
    retry_after: Option<Duration>,
}

/// Whether a failure is worth retrying — or not a failure at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Retried on the handler's durable schedule until attempts run out.
    Retryable,
    /// Dead-letters the event at once; an operator can retry it.
    Terminal,
    /// Not a failure: the step is waiting on an outside state and asks to run
    /// again after `delay`, without spending an attempt.
    Snooze {
        /// How long to wait before the step runs again.
        delay: Duration,
    },
}

impl StepError {
    /// A failure worth retrying later (a timeout, a 5xx, a dropped connection).
    pub fn retryable(message: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::Retryable,
            message: message.to_string(),
            retry_after: None,
        }
    }

    /// A retryable failure whose next attempt must wait at least `delay`
    /// (a 429 or 503 with `Retry-After`). It spends an attempt, unlike a snooze.
    pub fn retryable_after(delay: Duration, message: impl fmt::Display) -> Self {
        Self {
            retry_after: Some(delay),
            ..Self::retryable(message)
        }
    }

    /// The least delay before the next attempt, when the failure asked for one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// A failure that no retry will fix (a 4xx, invalid input): the event is
    /// dead-lettered with this message.
    pub fn terminal(message: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::Terminal,
            message: message.to_string(),
            retry_after: None,
        }
    }

    /// Run this step again after `delay`, without spending an attempt: the
    /// step is waiting on something outside (a payment to settle, a file to
    /// appear). Its idempotency key stays the same.
    pub fn snooze(delay: Duration, reason: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::Snooze { delay },
            message: reason.to_string(),
            retry_after: None,
        }
    }

    /// Whether this failure is retryable or terminal.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// Whether this failure dead-letters the event at once.
    pub fn is_terminal(&self) -> bool {
        self.kind == FailureKind::Terminal
    }

    /// The failure's message, as stored in the step-status table.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl<E> From<E> for StepError
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn from(error: E) -> Self {
        let mut message = error.to_string();
        let mut source = error.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::retryable(message)
    }
}

impl fmt::Debug for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Turns any `Result` into one whose error dead-letters the event:
/// `charge.await.terminal()?`.
pub trait TerminalExt<T> {
    /// Map the error to [`StepError::terminal`].
    fn terminal(self) -> Result<T, StepError>;
}

impl<T, E: fmt::Display> TerminalExt<T> for Result<T, E> {
    fn terminal(self) -> Result<T, StepError> {
        self.map_err(StepError::terminal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn question_mark_is_retryable_and_keeps_the_cause_chain() {
        fn parse() -> Result<u32, StepError> {
            Ok("x".parse::<u32>()?)
        }
        let error = parse().unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable);
        assert!(error.message().contains("invalid digit"));
    }

    #[test]
    fn terminal_ext_marks_terminal() {
        let result: Result<(), &str> = Err("customer closed");
        let error = result.terminal().unwrap_err();
        assert!(error.is_terminal());
        assert_eq!(error.to_string(), "customer closed");
    }
}
