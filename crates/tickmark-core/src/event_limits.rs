//! What an event may hold to enter the inbox: the limits the receiver
//! enforces on a pushed delivery, kept below both the receiver and the
//! reconciler so a pulled copy meets the same ones (an event the receiver
//! would refuse is never recorded through the back door).

/// Longest accepted event id, in bytes.
pub const MAX_ID_BYTES: usize = 255;

/// Longest accepted event kind, in bytes.
pub const MAX_KIND_BYTES: usize = 255;

/// The default body limit: 1 MiB, well above what providers send (Stripe,
/// GitHub and Shopify payloads stay far below it).
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;

/// Why a text is not acceptable as an id or kind of at most `max` bytes, if
/// it is not: empty, too long, or holding control characters (ASCII or C1).
pub fn text_problem(text: &str, max: usize) -> Option<&'static str> {
    if text.is_empty() {
        Some("empty")
    } else if text.len() > max {
        Some("too long")
    } else if text.chars().any(char::is_control) {
        Some("contains control characters")
    } else {
        None
    }
}
