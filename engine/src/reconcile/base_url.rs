//! The address of a provider's API: checked once when configured, and the
//! paths of its endpoints joined onto it (a base with a path of its own,
//! GitHub Enterprise's `https://HOST/api/v3`, keeps it).

use url::Url;

use super::error::ReconcileError;

/// A base URL for an API: absolute, http or https, no query.
pub(crate) fn parse_base(base_url: &str) -> Result<Url, ReconcileError> {
    let url = Url::parse(base_url)
        .map_err(|error| ReconcileError::Config(format!("API base URL `{base_url}`: {error}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.query().is_some() {
        return Err(ReconcileError::Config(format!(
            "API base URL `{base_url}`: give an http(s) address with no query"
        )));
    }
    Ok(url)
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
        assert_eq!(trailing_slash("/api/v3"), "/api/v3/");
        assert_eq!(trailing_slash("/"), "/");
    }
}
