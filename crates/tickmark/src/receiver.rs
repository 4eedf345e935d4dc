//! The webhook receiver: an axum router that verifies each provider's
//! signature, accepts each event once, and answers so the provider retries
//! only what was not recorded (the `tickmark-receiver` crate). Build one with
//! [`Receiver::new`]; serve it with [`serve`](crate::serve::serve). The
//! guide is docs/receiver.md.

pub use tickmark_receiver::{
    PublicBaseUrl, PublicUrlError, Receiver, ReceiverConfigError, StartupWarning,
    DEFAULT_BODY_LIMIT,
};

/// The axum this receiver is built with: mount its router in an
/// application's own with the same version.
#[doc(no_inline)]
pub use tickmark_receiver::axum;

/// One verifier per provider, and the [`Provider`](providers::Provider)
/// trait to write another.
pub mod providers {
    pub use tickmark_receiver::providers::{
        Algorithm, Delivery, Encoding, FieldSource, GenericHmac, GenericHmacConfig, GitHub,
        Provider, ProviderConfigError, Rejection, ReplayScope, Shopify, Slack, StandardWebhooks,
        Stripe, Twilio, Verdict, VerifiedEvent,
    };
}
