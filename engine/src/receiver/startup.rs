//! What the receiver warns about at start-up: configurations that work but
//! leave a door open. Warnings name the source, never a secret.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::providers::Provider;

/// The shortest signing secret that draws no warning, in bytes: 128 bits.
/// A shorter one can be guessed offline from a single captured delivery.
/// (Providers' own secrets are longer: Stripe's `whsec_…`, Shopify's, Slack's
/// and Twilio's 32 characters, Standard Webhooks' 24 to 64 random bytes.)
pub const MIN_SECRET_BYTES: usize = 16;

/// Something in the receiver's configuration an operator should fix.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupWarning {
    /// A signing secret of this source is shorter than [`MIN_SECRET_BYTES`].
    ShortSecret {
        /// The source.
        source: String,
        /// The length of its shortest secret, in bytes.
        bytes: usize,
    },
    /// A source whose signature covers the URL (Twilio) has no public base
    /// URL: the URL checked is built from the request's `Host` header, which
    /// the sender chooses.
    NoPublicUrl {
        /// The source.
        source: String,
    },
}

impl StartupWarning {
    /// The source it is about.
    pub fn source_name(&self) -> &str {
        match self {
            StartupWarning::ShortSecret { source, .. } | StartupWarning::NoPublicUrl { source } => {
                source
            }
        }
    }
}

impl fmt::Display for StartupWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartupWarning::ShortSecret { source, bytes } => write!(
                f,
                "source `{source}`: a signing secret is only {bytes} bytes long; use at least \
                 {MIN_SECRET_BYTES} random bytes, or one captured delivery lets it be guessed offline"
            ),
            StartupWarning::NoPublicUrl { source } => write!(
                f,
                "source `{source}` is signed over its URL but no public URL is configured: the URL \
                 is rebuilt from the request's Host header, which the sender chooses; set the \
                 public base URL (Receiver::public_base_url, `payments --public-url`)"
            ),
        }
    }
}

/// The warnings for these sources.
pub(crate) fn warnings(
    sources: &BTreeMap<String, Arc<dyn Provider>>,
    has_public_url: bool,
) -> Vec<StartupWarning> {
    let mut warnings = Vec::new();
    for (name, provider) in sources {
        if let Some(bytes) = provider
            .shortest_secret_bytes()
            .filter(|bytes| *bytes < MIN_SECRET_BYTES)
        {
            warnings.push(StartupWarning::ShortSecret {
                source: name.clone(),
                bytes,
            });
        }
        if provider.signs_public_url() && !has_public_url {
            warnings.push(StartupWarning::NoPublicUrl {
                source: name.clone(),
            });
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::super::providers::{GitHub, Stripe, Twilio};
    use super::*;

    fn sources(list: Vec<(&str, Arc<dyn Provider>)>) -> BTreeMap<String, Arc<dyn Provider>> {
        list.into_iter()
            .map(|(name, provider)| (name.to_owned(), provider))
            .collect()
    }

    #[test]
    fn short_secrets_and_twilio_without_a_public_url_are_warned_about() {
        let sources = sources(vec![
            (
                "sms",
                Arc::new(Twilio::new(["tok-12345", "a-long-enough-token-0123"]).unwrap()),
            ),
            (
                "gh",
                Arc::new(GitHub::new(["a-long-enough-secret-0123"]).unwrap()),
            ),
            ("pay", Arc::new(Stripe::new(["whsec_test"]).unwrap())),
        ]);
        assert_eq!(
            warnings(&sources, false),
            [
                StartupWarning::ShortSecret {
                    source: "pay".into(),
                    bytes: 10
                },
                StartupWarning::ShortSecret {
                    source: "sms".into(),
                    bytes: 9
                },
                StartupWarning::NoPublicUrl {
                    source: "sms".into()
                },
            ]
        );
        // With a public URL, only the short secrets remain.
        assert_eq!(warnings(&sources, true).len(), 2);
        // The words name the source, never the secret.
        for warning in warnings(&sources, false) {
            let text = warning.to_string();
            assert!(text.contains(warning.source_name()), "{text}");
            assert!(
                !text.contains("tok-12345") && !text.contains("whsec_test"),
                "{text}"
            );
        }
    }

    #[test]
    fn long_secrets_draw_no_warning() {
        let secret = "s".repeat(MIN_SECRET_BYTES);
        let sources = sources(vec![("gh", Arc::new(GitHub::new([secret]).unwrap()))]);
        assert!(warnings(&sources, false).is_empty());
    }
}
