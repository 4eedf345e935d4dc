//! Which webhook sources the app mounts: one per provider, each turned on by
//! its secret's environment variable. A source without a secret is off (its
//! path answers 404) and the app says so at start-up.

use tickmark::receiver::providers::{
    GitHub, ProviderConfigError, Shopify, Slack, StandardWebhooks, Stripe, Twilio,
};
use tickmark::receiver::ReceiverConfigError;
use tickmark::Receiver;

use crate::secrets::secrets;

/// (source name, provider, environment variable) for every source the app knows.
pub const SOURCES: [(&str, &str, &str); 6] = [
    ("stripe", "Stripe", "STRIPE_WEBHOOK_SECRET"),
    ("github", "GitHub", "GITHUB_WEBHOOK_SECRET"),
    ("shopify", "Shopify", "SHOPIFY_WEBHOOK_SECRET"),
    ("standard", "Standard Webhooks", "STANDARD_WEBHOOK_SECRET"),
    ("slack", "Slack", "SLACK_SIGNING_SECRET"),
    ("twilio", "Twilio", "TWILIO_AUTH_TOKEN"),
];

/// What happened to one source at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSetup {
    /// Mounted at `/hooks/{name}` with this many secrets.
    On {
        /// The source name.
        name: &'static str,
        /// How many secrets (more than one during a rotation).
        secrets: usize,
    },
    /// Not mounted: its variable is unset or empty.
    Off {
        /// The source name.
        name: &'static str,
        /// The variable that would turn it on.
        variable: &'static str,
    },
}

/// Why a source could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// The secrets in a source's variable are not usable.
    #[error("{variable}: {error}")]
    Secret {
        /// The variable that holds them.
        variable: &'static str,
        /// The provider's reason.
        #[source]
        error: ProviderConfigError,
    },
    /// The receiver refused the source.
    #[error(transparent)]
    Receiver(#[from] ReceiverConfigError),
}

/// Mount every source whose secret `secret_of(variable)` gives. A variable
/// may hold several comma-separated secrets (during a rotation: the new one
/// and the old one); a delivery signed with any of them verifies.
pub fn mount_sources(
    mut receiver: Receiver,
    secret_of: impl Fn(&str) -> Option<String>,
) -> Result<(Receiver, Vec<SourceSetup>), MountError> {
    let mut setup = Vec::new();
    for (name, _, variable) in SOURCES {
        let Some(secrets) = secrets(secret_of(variable)) else {
            setup.push(SourceSetup::Off { name, variable });
            continue;
        };
        let failed = |error| MountError::Secret { variable, error };
        receiver = match name {
            "stripe" => receiver.source(name, Stripe::new(&secrets).map_err(failed)?)?,
            "github" => receiver.source(name, GitHub::new(&secrets).map_err(failed)?)?,
            "shopify" => receiver.source(name, Shopify::new(&secrets).map_err(failed)?)?,
            "standard" => {
                receiver.source(name, StandardWebhooks::new(&secrets).map_err(failed)?)?
            }
            "slack" => receiver.source(name, Slack::new(&secrets).map_err(failed)?)?,
            _ => receiver.source(name, Twilio::new(&secrets).map_err(failed)?)?,
        };
        setup.push(SourceSetup::On {
            name,
            secrets: secrets.len(),
        });
    }
    Ok((receiver, setup))
}
