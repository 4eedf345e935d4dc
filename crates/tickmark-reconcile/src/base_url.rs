//! The address of a provider's API: checked once when configured, and the
//! paths of its endpoints joined onto it (a base with a path of its own,
//! GitHub Enterprise's `https://HOST/api/v3`, keeps it).
//!
//! The API key or token goes with every request, so a base URL must be
//! `https://`; plain `http://` is taken only for a loopback host (a test
//! server, a local proxy that does TLS itself), where nothing crosses a
//! network.

use std::net::IpAddr;

use url::{Host, Url};

use super::error::ReconcileError;

/// A base URL for an API: absolute, https (or http on a loopback host), no
/// query.
pub(crate) fn parse_base(base_url: &str) -> Result<Url, ReconcileError> {
    let shown = tickmark_core::redact_url(base_url);
    let url = Url::parse(base_url)
        .map_err(|error| ReconcileError::Config(format!("API base URL `{shown}`: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.query().is_some() {
        return Err(ReconcileError::Config(format!(
            "API base URL `{shown}`: give an https address with no query"
        )));
    }
    if url.scheme() == "http" && !is_loopback(&url) {
        return Err(ReconcileError::Config(format!(
            "API base URL `{shown}`: plain http would send the API key in clear over the \
             network; give an https address (http is taken only for a loopback host: \
             127.0.0.1, ::1, localhost)"
        )));
    }
    Ok(url)
}

/// Whether `url`'s host is this machine: a loopback address, or `localhost`
/// (which resolves only to loopback: RFC 6761, section 6.3).
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        Some(Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// The path of a base URL, ending in `/`.
pub(crate) fn trailing_slash(path: &str) -> String {
    if path.ends_with('/') {
        path.to_owned()
    } else {
        format!("{path}/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_absolute_http_addresses_without_a_query() {
        assert!(parse_base("https://api.stripe.com").is_ok());
        assert!(parse_base("http://127.0.0.1:8080/api/v3").is_ok());
        for bad in ["api.stripe.com", "ftp://x", "https://x/?a=1", ""] {
            assert!(parse_base(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plain_http_is_refused_unless_the_host_is_loopback() {
        for local in [
            "http://127.0.0.1:8080",
            "http://127.8.9.10",
            "http://[::1]:9000/api/v3",
            "http://localhost:12111",
            "http://LOCALHOST",
        ] {
            assert!(parse_base(local).is_ok(), "{local}");
        }
        for remote in [
            "http://api.stripe.com",
            "http://10.0.0.5:8080",
            "http://[2001:db8::1]",
            "http://localhost.evil.example",
            "http://127.0.0.1.nip.io",
        ] {
            let error = parse_base(remote).expect_err(remote).to_string();
            assert!(error.contains("https"), "{remote}: {error}");
        }
        assert_eq!(trailing_slash("/api/v3"), "/api/v3/");
        assert_eq!(trailing_slash("/"), "/");
    }
}
