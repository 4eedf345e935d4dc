//! Where outbox messages go: endpoint name → URL and signing secret, an
//! engine resource so that neither is stored in a plan.

use std::collections::HashMap;
use std::fmt;

use http::Uri;

use super::signature::decode_secret;
use crate::error::ConfigError;
use crate::http_client::check_scheme;

/// The endpoints outbox messages are delivered to, by name. Register it with
/// `Engine::with_resource` in every process that delivers (and, to catch a
/// mistyped name at once, in those that enqueue). Its `Debug` never shows a
/// secret.
///
/// ```
/// use tickmark_steps::outbox::OutboxEndpoints;
///
/// let endpoints = OutboxEndpoints::new()
///     .endpoint("partner", "http://partner.internal/webhooks", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
/// assert_eq!(endpoints.get("partner").unwrap().url(), "http://partner.internal/webhooks");
/// assert!(!format!("{endpoints:?}").contains("MfKQ"));
/// assert!(OutboxEndpoints::new().endpoint("x", "http://h/", "whsec_!!").is_err());
/// # Ok::<(), tickmark_steps::ConfigError>(())
/// ```
#[derive(Clone, Default)]
pub struct OutboxEndpoints {
    by_name: HashMap<String, Endpoint>,
}

/// One endpoint: its URL and signing key.
#[derive(Clone)]
pub struct Endpoint {
    url: Uri,
    key: Vec<u8>,
}

impl Endpoint {
    /// Where messages are POSTed.
    pub fn url(&self) -> &Uri {
        &self.url
    }

    /// The signing key's bytes (the secret, base64-decoded).
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }
}

impl OutboxEndpoints {
    /// No endpoints yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add (or replace) endpoint `name`: messages are POSTed to `url` and
    /// signed with `secret` (`whsec_` + base64 of the key, as Standard
    /// Webhooks secrets are written; bare base64 is accepted too).
    pub fn endpoint(
        mut self,
        name: impl Into<String>,
        url: &str,
        secret: &str,
    ) -> Result<Self, ConfigError> {
        let name = name.into();
        let url: Uri =
            url.parse()
                .map_err(|error: http::uri::InvalidUri| ConfigError::InvalidUrl {
                    endpoint: name.clone(),
                    reason: error.to_string(),
                })?;
        check_scheme(&url).map_err(|error| ConfigError::InvalidUrl {
            endpoint: name.clone(),
            reason: error.message().to_owned(),
        })?;
        let key = decode_secret(secret).map_err(|reason| ConfigError::InvalidSecret {
            endpoint: name.clone(),
            reason,
        })?;
        self.by_name.insert(name, Endpoint { url, key });
        Ok(self)
    }

    /// Endpoint `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&Endpoint> {
        self.by_name.get(name)
    }
}

impl fmt::Debug for OutboxEndpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.by_name.iter()).finish()
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.url)
            .field("secret", &"<redacted>")
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_secrets_are_checked_when_configured() {
        let ok = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        for url in ["not a url", "/relative", "ftp://h/x"] {
            assert!(
                matches!(
                    OutboxEndpoints::new().endpoint("e", url, ok),
                    Err(ConfigError::InvalidUrl { .. })
                ),
                "{url}"
            );
        }
        for secret in ["", "whsec_", "whsec_***"] {
            assert!(
                matches!(
                    OutboxEndpoints::new().endpoint("e", "http://h/", secret),
                    Err(ConfigError::InvalidSecret { .. })
                ),
                "{secret}"
            );
        }
        let https = OutboxEndpoints::new().endpoint("e", "https://h/", ok);
        assert_eq!(https.is_ok(), cfg!(feature = "rustls"));
    }
}
