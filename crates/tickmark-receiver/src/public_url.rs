//! The public URL of a delivery: the URL the provider posted to. Twilio signs
//! it, so it must be exactly what Twilio used, and behind a proxy or a TLS
//! terminator the receiver cannot see it: it is configured as a base
//! ([`PublicBaseUrl`]) and the request's own path and query are appended.

use std::fmt;
use std::str::FromStr;

use axum::http::{header, HeaderMap, Uri};
use url::Url;

/// The scheme, host (and optional port and path prefix) under which the
/// provider reaches this receiver, e.g. `https://hooks.example.com` or
/// `https://example.com/tickmark` when a proxy strips `/tickmark`.
///
/// The public URL of a delivery is this base (without a trailing `/`)
/// followed by the request's path and query as received.
///
/// ```
/// use tickmark::receiver::PublicBaseUrl;
/// let base: PublicBaseUrl = "https://hooks.example.com/".parse().unwrap();
/// assert_eq!(base.as_str(), "https://hooks.example.com");
/// assert!("hooks.example.com".parse::<PublicBaseUrl>().is_err());
/// assert!("https://hooks.example.com/?a=1".parse::<PublicBaseUrl>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicBaseUrl(String);

/// Why a text is not a usable public base URL.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublicUrlError {
    /// It does not start with `http://` or `https://`.
    #[error("the public URL must start with `https://` (or `http://`), e.g. `https://hooks.example.com`")]
    NotHttp,
    /// There is no host after the scheme.
    #[error("the public URL has no host, e.g. `https://hooks.example.com`")]
    NoHost,
    /// It has a query, a fragment, whitespace or control characters; the
    /// request's own path and query are appended to it.
    #[error("the public URL must be a scheme, host and optional path only: no `?`, `#`, spaces or control characters (the request's path and query are appended)")]
    NotABase,
}

impl PublicBaseUrl {
    /// Check and normalise a base URL: parsed with the `url` crate (the
    /// WHATWG URL standard, as browsers and Twilio's helper libraries read
    /// URLs), kept in its normal form (lower-case scheme and host, no default
    /// port), without trailing `/`s.
    pub fn parse(text: &str) -> Result<Self, PublicUrlError> {
        let text = text.trim();
        // `url` would quietly drop tabs and newlines and escape other
        // control characters: a base with any of them is a mistake.
        if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(PublicUrlError::NotABase);
        }
        let url = Url::parse(text).map_err(|error| match error {
            url::ParseError::EmptyHost => PublicUrlError::NoHost,
            url::ParseError::RelativeUrlWithoutBase => PublicUrlError::NotHttp,
            _ => PublicUrlError::NotABase,
        })?;
        if !matches!(url.scheme(), "https" | "http") {
            return Err(PublicUrlError::NotHttp);
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(PublicUrlError::NoHost);
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(PublicUrlError::NotABase);
        }
        Ok(Self(url.as_str().trim_end_matches('/').to_owned()))
    }

    /// The base, without a trailing `/`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for PublicBaseUrl {
    type Err = PublicUrlError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

impl fmt::Display for PublicBaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The URL the provider posted to: the configured base + the request's path
/// and query, or — without a base — `http://` + the `Host` header + path and
/// query, which is only right when nothing sits between the provider and
/// this process.
pub(crate) fn public_url(base: Option<&PublicBaseUrl>, uri: &Uri, headers: &HeaderMap) -> String {
    let path_and_query = uri.path_and_query().map(|pq| pq.as_str()).unwrap_or("/");
    match base {
        Some(base) => format!("{}{path_and_query}", base.as_str()),
        None => {
            let host = headers
                .get(header::HOST)
                .and_then(|value| value.to_str().ok())
                .or_else(|| uri.authority().map(|authority| authority.as_str()))
                .unwrap_or("localhost");
            format!("http://{host}{path_and_query}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_checked_and_normalised() {
        for (text, base) in [
            ("https://h.example", "https://h.example"),
            ("https://h.example/", "https://h.example"),
            (
                "HTTPS://H.example:8443/prefix//",
                "https://h.example:8443/prefix",
            ),
            ("https://h.example:443/", "https://h.example"),
            (" http://127.0.0.1:8080 ", "http://127.0.0.1:8080"),
        ] {
            assert_eq!(PublicBaseUrl::parse(text).unwrap().as_str(), base);
        }
        assert_eq!(
            PublicBaseUrl::parse("ftp://h"),
            Err(PublicUrlError::NotHttp)
        );
        assert_eq!(
            PublicBaseUrl::parse("https://"),
            Err(PublicUrlError::NoHost)
        );
        assert_eq!(
            PublicBaseUrl::parse("hooks.example.com"),
            Err(PublicUrlError::NotHttp)
        );
        for bad in [
            "https://h/?",
            "https://h:port/",
            "https://h/?x=1",
            "https://h/#f",
            "https://h /x",
            "https://h/\u{7}",
        ] {
            assert_eq!(
                PublicBaseUrl::parse(bad),
                Err(PublicUrlError::NotABase),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_public_url_is_base_plus_path_and_query() {
        let uri: Uri = "/hooks/twilio?a=1&b=%20".parse().unwrap();
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, "internal:8080".parse().unwrap());
        let base = PublicBaseUrl::parse("https://hooks.example.com/").unwrap();
        assert_eq!(
            public_url(Some(&base), &uri, &headers),
            "https://hooks.example.com/hooks/twilio?a=1&b=%20"
        );
        assert_eq!(
            public_url(None, &uri, &headers),
            "http://internal:8080/hooks/twilio?a=1&b=%20"
        );
        assert_eq!(
            public_url(None, &"/x".parse().unwrap(), &HeaderMap::new()),
            "http://localhost/x"
        );
    }
}
