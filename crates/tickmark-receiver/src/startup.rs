//! What the receiver warns about at start-up: configurations that work but
//! leave a door open, and sources that do not meet the handlers (a mounted
//! source no handler takes, a handler's source not mounted here). Warnings
//! name the source, never a secret.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use super::providers::Provider;
use tickmark_core::handler::{KindsHandled, Registry};

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
    /// A mounted source that no handler takes, whatever the kind, and no
    /// wait reads: every event of it is recorded as `ignored` and nothing
    /// runs.
    UnhandledSource {
        /// The source.
        source: String,
    },
    /// Handlers (or waits) name a source this receiver does not mount: its
    /// events reach them only if another receiver mounts it, or if the
    /// application accepts them itself ([`Engine::accept`](tickmark_core::Engine::accept),
    /// `accept_in`). Informational ([`StartupWarning::is_informational`]): in
    /// a fleet where each process receives some sources, this is expected.
    /// A source the application accepts itself is declared with
    /// [`Receiver::in_process_source`](super::Receiver::in_process_source)
    /// and draws no such notice.
    UnmountedSource {
        /// The source.
        source: String,
    },
}

impl StartupWarning {
    /// The source it is about.
    pub fn source_name(&self) -> &str {
        match self {
            StartupWarning::ShortSecret { source, .. }
            | StartupWarning::NoPublicUrl { source }
            | StartupWarning::UnhandledSource { source }
            | StartupWarning::UnmountedSource { source } => source,
        }
    }

    /// Whether this is worth knowing rather than fixing: logged at `info`,
    /// where the others are logged at `warn`.
    pub fn is_informational(&self) -> bool {
        matches!(self, StartupWarning::UnmountedSource { .. })
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
            StartupWarning::UnhandledSource { source } => write!(
                f,
                "source `{source}` is mounted but no handler takes any of its kinds: every event \
                 of it is recorded as `ignored` and nothing runs; register one with \
                 Handlers::on(\"{source}\", kind, …), or stop mounting the source"
            ),
            StartupWarning::UnmountedSource { source } => write!(
                f,
                "handlers are registered for source `{source}`, but this receiver does not mount \
                 it: its events reach them only if another receiver mounts it (then nothing is \
                 wrong), or if the application accepts them itself with Engine::accept or \
                 accept_in (declare that with Receiver::in_process_source(\"{source}\") and this \
                 notice goes); otherwise mount it with Receiver::source(\"{source}\", …)"
            ),
        }
    }
}

/// The warnings for these sources and handlers: the configuration's first,
/// source by source, then how the sources meet the handlers.
pub(crate) fn warnings(
    sources: &BTreeMap<String, Arc<dyn Provider>>,
    in_process: &BTreeSet<String>,
    has_public_url: bool,
    registry: &Registry,
) -> Vec<StartupWarning> {
    let mut warnings = configuration_warnings(sources, has_public_url);
    warnings.extend(coverage_warnings(sources, in_process, registry));
    warnings
}

/// How the mounted sources meet the handlers: a mounted source no handler
/// takes and no wait reads, then each source the handlers name that is
/// neither mounted nor accepted in process, in name order.
fn coverage_warnings(
    sources: &BTreeMap<String, Arc<dyn Provider>>,
    in_process: &BTreeSet<String>,
    registry: &Registry,
) -> Vec<StartupWarning> {
    let unhandled = sources
        .keys()
        .filter(|source| {
            registry.kinds_handled(source) == KindsHandled::Only(Vec::new())
                && !registry.is_waited_on(source)
        })
        .map(|source| StartupWarning::UnhandledSource {
            source: source.clone(),
        });
    let unmounted = registry
        .named_sources()
        .into_iter()
        .filter(|source| !sources.contains_key(*source) && !in_process.contains(*source))
        .map(|source| StartupWarning::UnmountedSource {
            source: source.to_owned(),
        });
    unhandled.chain(unmounted).collect()
}

/// The kinds of `source` a handler takes, in words for the start-up log:
/// `every kind`, `invoice.paid, charge.refunded`, or `none`.
pub(crate) fn kinds_handled_text(registry: &Registry, source: &str) -> String {
    match registry.kinds_handled(source) {
        KindsHandled::Every => "every kind".to_owned(),
        KindsHandled::Only(kinds) if kinds.is_empty() => "none".to_owned(),
        KindsHandled::Only(kinds) => kinds.join(", "),
    }
}

/// Short secrets, and URL-signing sources without a public URL.
fn configuration_warnings(
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
            configuration_warnings(&sources, false),
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
        assert_eq!(configuration_warnings(&sources, true).len(), 2);
        // The words name the source, never the secret.
        for warning in configuration_warnings(&sources, false) {
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
        assert!(configuration_warnings(&sources, false).is_empty());
    }

    #[derive(Debug, serde::Serialize, serde::Deserialize)]
    struct Noop;

    #[typetag::serde(name = "receiver_startup_test_noop")]
    #[async_trait::async_trait]
    impl tickmark_core::step::Step for Noop {
        async fn run(
            &self,
            _ctx: &mut tickmark_core::context::StepContext<'_>,
        ) -> tickmark_core::step::StepResult {
            Ok(serde_json::Value::Null)
        }
    }

    fn compiled(handlers: tickmark_core::Handlers) -> Registry {
        handlers.compile().unwrap()
    }

    fn handler() -> tickmark_core::Handler {
        tickmark_core::Handler::new().named_step("noop", Noop)
    }

    fn long_secret() -> Arc<dyn Provider> {
        Arc::new(GitHub::new(["a-long-enough-secret-0123"]).unwrap())
    }

    /// A mounted source no handler takes is warned about; a source the
    /// handlers name that is not mounted is an informational notice. A
    /// source taken through `*`, or read by a wait, is covered.
    #[test]
    fn sources_without_handlers_and_handlers_without_sources_are_said() {
        let sources = sources(vec![
            ("stripe", long_secret()),
            ("github", long_secret()),
            ("shop", long_secret()),
            ("spare", long_secret()),
        ]);
        let registry = compiled(
            tickmark_core::Handlers::new()
                .on("stripe", "invoice.paid", handler())
                .on("github", tickmark_core::ANY, handler())
                .on(
                    "paddle",
                    "order.created",
                    tickmark_core::Handler::new()
                        .wait(
                            "shipped",
                            tickmark_driver::wait::WaitFor::event("shop", "order.shipped")
                                .matching("/id")
                                .timeout(std::time::Duration::from_secs(60)),
                        )
                        .named_step("noop", Noop)
                        .if_matched("shipped"),
                )
                .on("twilio", "message", handler()),
        );
        let said = warnings(&sources, &BTreeSet::new(), false, &registry);
        assert_eq!(
            said,
            [
                StartupWarning::UnhandledSource {
                    source: "spare".into()
                },
                StartupWarning::UnmountedSource {
                    source: "paddle".into()
                },
                StartupWarning::UnmountedSource {
                    source: "twilio".into()
                },
            ]
        );
        assert!(!said[0].is_informational());
        assert!(said[1].is_informational() && said[2].is_informational());
        let text = said[0].to_string();
        assert!(
            text.contains("`spare`") && text.contains("`ignored`"),
            "{text}"
        );
        assert!(said[1].to_string().contains("does not mount"));
        assert_eq!(kinds_handled_text(&registry, "stripe"), "invoice.paid");
        assert_eq!(kinds_handled_text(&registry, "github"), "every kind");
        assert_eq!(kinds_handled_text(&registry, "spare"), "none");

        // A handler for every source takes every mounted source.
        let everything = compiled(tickmark_core::Handlers::new().on(
            tickmark_core::ANY,
            tickmark_core::ANY,
            handler(),
        ));
        assert!(warnings(&sources, &BTreeSet::new(), false, &everything).is_empty());
        // A handler for one kind of any source takes that kind of each.
        let one_kind =
            compiled(tickmark_core::Handlers::new().on(tickmark_core::ANY, "ping", handler()));
        assert!(warnings(&sources, &BTreeSet::new(), false, &one_kind).is_empty());
        // No handlers: every mounted source is unhandled.
        assert_eq!(
            warnings(&sources, &BTreeSet::new(), false, &Registry::default()).len(),
            4
        );
    }

    /// A source the application accepts itself (`accept_in`), declared so,
    /// draws no notice to mount it; the others still do.
    #[test]
    fn a_source_accepted_in_process_is_not_told_to_mount() {
        let sources = sources(vec![("stripe", long_secret())]);
        let registry = compiled(
            tickmark_core::Handlers::new()
                .on("stripe", "invoice.paid", handler())
                .on("app", "order.created", handler())
                .on("paddle", "order.created", handler()),
        );
        let in_process = BTreeSet::from(["app".to_owned()]);
        assert_eq!(
            warnings(&sources, &in_process, false, &registry),
            [StartupWarning::UnmountedSource {
                source: "paddle".into()
            }]
        );
        let said = warnings(&sources, &BTreeSet::new(), false, &registry);
        assert_eq!(said.len(), 2);
        let text = said[0].to_string();
        assert!(
            text.contains("accept_in") && text.contains("in_process_source(\"app\")"),
            "{text}"
        );
    }
}
