//! How long a provider may deliver an event again: by its own retries, or
//! by a resend that someone asks of it (a dashboard's "Resend", its API).
//! Accepted events must be remembered at least this long (the dedup window,
//! kept by prune's tombstones): a redelivery after it would be accepted as
//! new and run again. Each figure cites the provider's own documentation
//! (docs/receiver.md, "How long providers deliver again").

use std::time::Duration;

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// (source name, retry window, where the figure comes from).
pub(crate) const PROVIDER_RETRY_WINDOWS: &[(&str, Duration, &str)] = &[
    (
        "stripe",
        Duration::from_secs(30 * DAY),
        "Stripe retries for up to 3 days, and an event can be resent by hand or through List \
         Events for 30 days",
    ),
    (
        "github",
        Duration::from_secs(3 * DAY),
        "GitHub never retries, but a delivery can be redelivered by hand or through the API \
         for 3 days",
    ),
    (
        "standard_webhooks",
        Duration::from_secs(3 * DAY),
        "Standard Webhooks senders retry for about 3 days",
    ),
    (
        "standard",
        Duration::from_secs(3 * DAY),
        "Standard Webhooks senders retry for about 3 days",
    ),
    (
        "svix",
        Duration::from_secs(28 * HOUR),
        "Svix's retry schedule ends after about 28 hours",
    ),
    (
        "shopify",
        Duration::from_secs(4 * HOUR),
        "Shopify retries 8 times over 4 hours",
    ),
];

/// What a source not in the table counts as: the longest known window, the safe side.
pub(crate) const UNKNOWN_SOURCE_WINDOW: Duration = Duration::from_secs(30 * DAY);

/// The retry window of one source (by name, case-insensitive).
pub(crate) fn window(source: &str) -> Duration {
    PROVIDER_RETRY_WINDOWS
        .iter()
        .find(|(name, _, _)| name.eq_ignore_ascii_case(source))
        .map_or(UNKNOWN_SOURCE_WINDOW, |(_, window, _)| *window)
}

/// The source with the longest retry window among `sources`, and that window.
pub(crate) fn longest(sources: &[String]) -> Option<(&str, Duration)> {
    sources
        .iter()
        .map(|source| (source.as_str(), window(source)))
        .max_by_key(|(_, window)| *window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_sources_have_their_window_and_others_the_safest() {
        assert_eq!(window("shopify"), Duration::from_secs(4 * HOUR));
        assert_eq!(window("Svix"), Duration::from_secs(28 * HOUR));
        assert_eq!(window("stripe"), Duration::from_secs(30 * DAY));
        assert_eq!(window("GitHub"), Duration::from_secs(3 * DAY));
        assert_eq!(window("my-erp"), UNKNOWN_SOURCE_WINDOW);
        let sources = ["shopify".to_owned(), "svix".to_owned()];
        assert_eq!(
            longest(&sources),
            Some(("svix", Duration::from_secs(28 * HOUR)))
        );
        assert_eq!(longest(&[]), None);
    }

    #[test]
    fn the_unknown_window_is_the_longest_known_one() {
        let longest_known = PROVIDER_RETRY_WINDOWS
            .iter()
            .map(|(_, window, _)| *window)
            .max();
        assert_eq!(longest_known, Some(UNKNOWN_SOURCE_WINDOW));
    }
}
