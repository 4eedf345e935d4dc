//! What a step's run returns: an output, or a [`StepError`] that says whether
//! to retry, dead-letter, park the event for a fixed build, or run the step
//! again later without spending an attempt.

use std::any::Any;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

/// What a step returns: a JSON output (stored with its mark and handed to later
/// steps), or a [`StepError`].
pub type StepResult = Result<serde_json::Value, StepError>;

/// A step's output from any `Serialize` value: `return tickmark::output(&credit)`.
/// A later step reads it back typed with
/// [`StepContext::output_of`](crate::StepContext::output_of). A value that
/// cannot be written as JSON (a map with non-text keys) is a bug in the step:
/// it parks the event ([`StepError::park`]).
pub fn output<T: Serialize + ?Sized>(value: &T) -> StepResult {
    serde_json::to_value(value).map_err(|error| {
        StepError::park(format!(
            "the step's output (`{}`) cannot be written as JSON: {error}",
            std::any::type_name::<T>()
        ))
    })
}

/// How a step failed: retryable (the default for `?`), terminal, or parking
/// (the default for `?` on a `serde_json` decode error).
///
/// `StepError` deliberately does not implement `std::error::Error`, so that
/// `?` can convert any error into it.
pub struct StepError {
    kind: FailureKind,
    message: String,
    retry_after: Option<Duration>,
}

/// Whether a failure is worth retrying — or not a failure at all.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Retried on the handler's durable schedule until attempts run out.
    Retryable,
    /// Dead-letters the event at once; an operator can retry it.
    Terminal,
    /// Parks the event at once (state `parked`, with the message), as a plan
    /// naming a step type this build lacks does: no retry can help, only a
    /// build that handles the event (a payload that does not decode into the
    /// step's type). Deploy the fix, then an operator retries the event; it
    /// resumes at this step.
    Park,
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

    /// A failure that only a fixed build can get past (the event's data does
    /// not fit the step's types): the event is parked with this message, not
    /// retried and not dead-lettered, and resumes at this step when an
    /// operator retries it after the fix is deployed. A `?` on a
    /// `serde_json` decode error and [`StepContext::payload`](crate::StepContext::payload)
    /// make one.
    pub fn park(message: impl fmt::Display) -> Self {
        Self {
            kind: FailureKind::Park,
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

    /// Whether this failure is retryable, terminal, parks the event, or is a snooze.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// Whether this failure dead-letters the event at once.
    pub fn is_terminal(&self) -> bool {
        self.kind == FailureKind::Terminal
    }

    /// Whether this failure parks the event for a fixed build.
    pub fn parks_event(&self) -> bool {
        self.kind == FailureKind::Park
    }

    /// The failure's message, as stored in the step-status table.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// `?` on any error: retryable, except a `serde_json` error about the data
/// itself (a syntax error, a missing field, a wrong type, a cut-off text),
/// which parks the event: the same bytes will not decode on the next attempt,
/// only a build with a type that fits them will. A `serde_json` I/O error
/// (reading from a stream) stays retryable. To retry a decode error anyway
/// (a far side that sent a half-written body), say so:
/// `serde_json::from_slice(&body).map_err(StepError::retryable)?`.
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
        if is_undecodable(&error) {
            Self::park(format!("the data does not decode: {message}"))
        } else {
            Self::retryable(message)
        }
    }
}

/// Whether `error` is serde_json's word that the data itself does not fit
/// (not an I/O failure while reading it).
fn is_undecodable(error: &(dyn Any + Send + Sync)) -> bool {
    error
        .downcast_ref::<serde_json::Error>()
        .is_some_and(|error| !error.is_io())
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
    fn question_mark_on_a_serde_decode_error_parks() {
        #[derive(Debug, serde::Deserialize)]
        struct Invoice {
            #[allow(dead_code)]
            amount_paid: i64,
        }
        fn decode(text: &str) -> Result<Invoice, StepError> {
            Ok(serde_json::from_str(text)?)
        }
        for (bad, says) in [
            (r#"{"amount_paid": "12"}"#, "invalid type"),
            (r#"{}"#, "missing field `amount_paid`"),
            (r#"{"amount_paid": "#, "EOF"),
            (r#"{amount_paid}"#, "key must be a string"),
        ] {
            let error = decode(bad).unwrap_err();
            assert_eq!(error.kind(), FailureKind::Park, "{bad}: {error}");
            assert!(error.parks_event() && !error.is_terminal());
            assert!(error.message().contains(says), "{bad}: {error}");
            assert!(error.message().contains("line 1 column"), "{error}");
        }
        let value: Result<Invoice, StepError> =
            serde_json::from_value(serde_json::json!({"amount_paid": []})).map_err(Into::into);
        assert_eq!(value.unwrap_err().kind(), FailureKind::Park);
    }

    #[test]
    fn question_mark_on_a_serde_io_error_is_retryable() {
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("connection reset"))
            }
        }
        fn decode() -> Result<serde_json::Value, StepError> {
            Ok(serde_json::from_reader(Broken)?)
        }
        let error = decode().unwrap_err();
        assert_eq!(error.kind(), FailureKind::Retryable, "{error}");
        assert!(error.message().contains("connection reset"), "{error}");
    }

    #[test]
    fn an_output_that_is_no_json_parks() {
        let fine = output(&serde_json::json!({"credited": 1200})).unwrap();
        assert_eq!(fine["credited"], 1200);
        let by_pair: std::collections::HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let error = output(&by_pair).unwrap_err();
        assert!(error.parks_event(), "{error}");
        assert!(error.message().contains("HashMap"), "{error}");
    }

    #[test]
    fn terminal_ext_marks_terminal() {
        let result: Result<(), &str> = Err("customer closed");
        let error = result.terminal().unwrap_err();
        assert!(error.is_terminal());
        assert_eq!(error.to_string(), "customer closed");
    }
}
