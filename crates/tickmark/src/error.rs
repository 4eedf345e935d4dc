//! The crate-level error: what can fail when setting tickmark up and using it.
//!
//! Each module keeps its own error enum, which says exactly what that part
//! can get wrong (a [`StoreError`] is matched to choose between 503 and 500,
//! a [`HandlerConfigError`] names the handler at fault). `Error` is the one type
//! every one of them converts into, so an application's set-up code can use
//! `?` on all of them and still match on the part that failed.

use tickmark_core::handler::HandlerConfigError;
use tickmark_core::metrics::RenderError;
use tickmark_core::operator::AdminError;
use tickmark_core::runner::WorkerConfigError;
use tickmark_driver::flow::RateLimitError;
use tickmark_driver::store::StoreError;

/// Any tickmark error.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The database failed or was unreachable.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A handler definition is wrong.
    #[error(transparent)]
    Config(#[from] HandlerConfigError),
    /// A worker's settings could never run.
    #[error(transparent)]
    WorkerConfig(#[from] WorkerConfigError),
    /// A rate limit's settings could never run.
    #[error(transparent)]
    RateLimit(#[from] RateLimitError),
    /// An operator's action was refused, or its store failed.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The metrics could not be rendered.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// A provider's verifier was given settings it cannot verify with (an
    /// empty or malformed secret).
    #[cfg(feature = "receiver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "receiver")))]
    #[error(transparent)]
    Provider(#[from] tickmark_receiver::providers::ProviderConfigError),
    /// A receiver's source name or path template is wrong.
    #[cfg(feature = "receiver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "receiver")))]
    #[error(transparent)]
    Receiver(#[from] tickmark_receiver::ReceiverConfigError),
    /// A receiver's public base URL is not one.
    #[cfg(feature = "receiver")]
    #[cfg_attr(docsrs, doc(cfg(feature = "receiver")))]
    #[error(transparent)]
    PublicUrl(#[from] tickmark_receiver::PublicUrlError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set-up code that returns `tickmark::Error` takes `?` on each part's
    /// error and keeps its words.
    #[test]
    fn every_part_of_the_set_up_converts_into_the_crate_error() {
        fn worker() -> Result<(), Error> {
            Err(WorkerConfigError::ZeroLease)?
        }
        let error = worker().unwrap_err();
        assert!(matches!(error, Error::WorkerConfig(_)), "{error:?}");
        assert_eq!(error.to_string(), WorkerConfigError::ZeroLease.to_string());
    }
}
