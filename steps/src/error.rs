//! Configuration errors of the ready-made steps' resources, raised when the
//! application builds them (at start-up), never while a step runs.

/// A resource was given a value it cannot use.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A header name or value is not valid HTTP.
    #[error("header `{name}` of credentials `{set}` is not valid HTTP: {reason}")]
    InvalidHeader {
        /// The credential set it belongs to.
        set: String,
        /// The header's name (never its value: it is a secret).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// An endpoint's URL is not an absolute `http://` or `https://` URL.
    #[error("endpoint `{endpoint}`: URL is not usable: {reason}")]
    InvalidUrl {
        /// The endpoint's name.
        endpoint: String,
        /// What is wrong.
        reason: String,
    },
    /// An endpoint's signing secret is not `whsec_` + base64 (or bare base64).
    #[error("endpoint `{endpoint}`: signing secret is not usable: {reason}")]
    InvalidSecret {
        /// The endpoint's name.
        endpoint: String,
        /// What is wrong (never the secret itself).
        reason: &'static str,
    },
}
