//! The `rel="next"` address of an HTTP `Link` header (RFC 8288), which is
//! how GitHub pages its lists: `<https://api.github.com/…&cursor=v1_9>;
//! rel="next"`. <https://docs.github.com/en/rest/using-the-rest-api/using-pagination-in-the-rest-api>
//!
//! Our own few lines rather than a crate: only `rel="next"` is read, and
//! the address is then checked to stay on the API's own origin.

use http::HeaderMap;

/// The `next` link among every `Link` header of `headers`, if any.
pub(crate) fn next_link(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(http::header::LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|entry| {
            let entry = entry.trim();
            let rest = entry.strip_prefix('<')?;
            let (target, params) = rest.split_once('>')?;
            let is_next = params.split(';').any(|param| {
                let Some((name, value)) = param.split_once('=') else {
                    return false;
                };
                name.trim().eq_ignore_ascii_case("rel")
                    && value
                        .trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|rel| rel.eq_ignore_ascii_case("next"))
            });
            is_next.then(|| target.to_owned())
        })
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in values {
            map.append(http::header::LINK, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn finds_next_among_other_relations() {
        let map = headers(&[
            r#"<https://api.github.com/x?per_page=2&cursor=v1_7>; rel="next", <https://api.github.com/x?per_page=2>; rel="first""#,
        ]);
        assert_eq!(
            next_link(&map).as_deref(),
            Some("https://api.github.com/x?per_page=2&cursor=v1_7")
        );
        let prev_first = headers(&[r#"<https://a/p>; rel="prev""#, r#"<https://a/n>; rel=next"#]);
        assert_eq!(next_link(&prev_first).as_deref(), Some("https://a/n"));
    }

    #[test]
    fn no_next_and_garbage_give_none() {
        assert_eq!(next_link(&headers(&[r#"<https://a/p>; rel="prev""#])), None);
        assert_eq!(
            next_link(&headers(&["garbage", "<unclosed; rel=next"])),
            None
        );
        assert_eq!(next_link(&HeaderMap::new()), None);
    }
}
