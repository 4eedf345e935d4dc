//! Where the dashboard is mounted, and the links between its pages.
//!
//! The dashboard may be served at `/` or nested (`Router::nest("/ops", …)`);
//! every link and redirect starts with the prefix it was reached under, read
//! from axum's `OriginalUri`, so the pages work wherever they are mounted.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::request::Parts;

/// The path prefix the dashboard is nested under (`""` at the root).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Base {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let inner = parts.uri.path();
        let original = parts
            .extensions
            .get::<OriginalUri>()
            .map(|uri| uri.0.path())
            .unwrap_or(inner);
        Ok(Base(prefix(original, inner)))
    }
}

/// The part of `original` before `inner` (the path the nested router saw).
fn prefix(original: &str, inner: &str) -> String {
    let prefix = original.strip_suffix(inner).or_else(|| {
        // Nested at `/ops`, a request for `/ops` reaches the router as `/`.
        (inner == "/").then_some(original)
    });
    prefix.unwrap_or("").trim_end_matches('/').to_owned()
}

impl Base {
    /// The event list, with a query built from `pairs` (empty values left out).
    pub fn events<'a>(&self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (key, value) in pairs {
            if !value.is_empty() {
                query.append_pair(key, value);
            }
        }
        let query = query.finish();
        if query.is_empty() {
            format!("{}/events", self.0)
        } else {
            format!("{}/events?{query}", self.0)
        }
    }

    /// One event's page.
    pub fn event(&self, event_seq: i64) -> String {
        format!("{}/events/{event_seq}", self.0)
    }

    /// Where the retry form posts.
    pub fn retry(&self, event_seq: i64) -> String {
        format!("{}/events/{event_seq}/retry", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_what_nesting_stripped() {
        assert_eq!(prefix("/events/3", "/events/3"), "");
        assert_eq!(prefix("/ops/events/3", "/events/3"), "/ops");
        assert_eq!(prefix("/ops", "/"), "/ops");
        assert_eq!(prefix("/ops/", "/"), "/ops");
        assert_eq!(prefix("/", "/"), "");
    }

    #[test]
    fn list_links_encode_their_query() {
        let base = Base("/ops".into());
        assert_eq!(base.events([]), "/ops/events");
        assert_eq!(
            base.events([("state", "dead"), ("source", ""), ("kind", "a&b c")]),
            "/ops/events?state=dead&kind=a%26b+c"
        );
        assert_eq!(base.event(7), "/ops/events/7");
    }
}
