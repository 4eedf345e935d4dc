//! The app's settings, shared with the steps as an engine resource: they
//! belong to the process, not to an event, so they are not in any plan.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use axum::http::Uri;

/// What the steps need to know about this process's set-up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where `send_receipt` POSTs receipts; `None` skips the step's call.
    pub receipt_url: Option<ReceiptUrl>,
    /// How long one receipt POST may take before it counts as a (retryable) timeout.
    pub receipt_timeout: Duration,
    /// The folder `render_invoice` writes `<event id>.txt` into.
    pub out_dir: PathBuf,
    /// How long `render_invoice` works before writing (a stand-in for a long job).
    pub render_for: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            receipt_url: None,
            receipt_timeout: Duration::from_secs(10),
            out_dir: PathBuf::from("invoices"),
            render_for: Duration::ZERO,
        }
    }
}

/// An `http://` URL to POST receipts to. (This example's client speaks plain
/// HTTP only, to keep its dependencies small: put a local stand-in, or a
/// TLS-terminating proxy, behind it.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptUrl(Uri);

/// Why a receipt URL is refused.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptUrlError {
    /// Not a URL.
    #[error("not a URL; expected e.g. http://127.0.0.1:9000/receipts")]
    Invalid,
    /// Not `http://`.
    #[error("only http:// URLs are supported by this example (put a TLS-terminating proxy in front of an https service)")]
    NotHttp,
}

impl ReceiptUrl {
    /// The URL.
    pub fn uri(&self) -> &Uri {
        &self.0
    }
}

impl FromStr for ReceiptUrl {
    type Err = ReceiptUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let uri: Uri = text.trim().parse().map_err(|_| ReceiptUrlError::Invalid)?;
        match uri.scheme_str() {
            Some("http") if uri.host().is_some() => Ok(Self(uri)),
            Some("http") | None => Err(ReceiptUrlError::Invalid),
            Some(_) => Err(ReceiptUrlError::NotHttp),
        }
    }
}

impl std::fmt::Display for ReceiptUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}
