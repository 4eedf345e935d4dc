//! Shared body helpers: media type, JSON and `application/x-www-form-urlencoded`
//! parsing. Only ever called after the signature has been verified (except
//! Twilio's lenient form decoding, which the signature is computed over).

use http::{header::CONTENT_TYPE, HeaderMap};
use serde_json::{Map, Value};

use super::signature::one_header;
use super::Rejection;

/// The media type of the request (`type/subtype`, lower-cased, parameters
/// dropped), `None` when there is no usable Content-Type.
pub(crate) fn media_type(headers: &HeaderMap) -> Result<Option<String>, Rejection> {
    let Some(value) = one_header(headers, &CONTENT_TYPE)? else {
        return Ok(None);
    };
    let Ok(text) = value.to_str() else {
        return Ok(None);
    };
    let essence = text.split(';').next().unwrap_or_default().trim();
    if essence.is_empty() {
        return Ok(None);
    }
    Ok(Some(essence.to_ascii_lowercase()))
}

/// True for `application/x-www-form-urlencoded`.
pub(crate) fn is_form(media: Option<&str>) -> bool {
    media == Some("application/x-www-form-urlencoded")
}

/// True for `application/json` and `application/*+json`.
pub(crate) fn is_json(media: Option<&str>) -> bool {
    matches!(media, Some(m) if m == "application/json" || (m.starts_with("application/") && m.ends_with("+json")))
}

/// The body as any JSON value.
pub(crate) fn parse_json(body: &[u8]) -> Result<Value, Rejection> {
    serde_json::from_slice(body).map_err(|_| Rejection::MalformedBody {
        reason: "not valid UTF-8 JSON; check the provider's content type setting",
    })
}

/// The body as a JSON object.
pub(crate) fn parse_json_object(body: &[u8]) -> Result<Map<String, Value>, Rejection> {
    match parse_json(body)? {
        Value::Object(map) => Ok(map),
        _ => Err(Rejection::MalformedBody {
            reason: "expected a JSON object",
        }),
    }
}

/// Numeric value of one hex digit.
fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `application/x-www-form-urlencoded` percent-decoding of one name or value:
/// `+` is a space, `%XX` a byte, and a `%` not followed by two hex digits is
/// kept literally (as the WHATWG URL standard says).
fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut rest = input;
    while let Some((&b, tail)) = rest.split_first() {
        match b {
            b'+' => {
                out.push(b' ');
                rest = tail;
            }
            b'%' => {
                let hi = tail.first().copied().and_then(hex_digit);
                let lo = tail.get(1).copied().and_then(hex_digit);
                match (hi, lo, tail.get(2..)) {
                    (Some(hi), Some(lo), Some(after)) => {
                        out.push((hi << 4) | lo);
                        rest = after;
                    }
                    _ => {
                        out.push(b'%');
                        rest = tail;
                    }
                }
            }
            _ => {
                out.push(b);
                rest = tail;
            }
        }
    }
    out
}

/// Decoded name/value byte pairs, in body order (empty pieces skipped).
fn form_pairs(body: &[u8]) -> impl Iterator<Item = (Vec<u8>, Vec<u8>)> + '_ {
    body.split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| match piece.iter().position(|&b| b == b'=') {
            Some(eq) => {
                let (name, value) = piece.split_at(eq);
                (
                    percent_decode(name),
                    percent_decode(value.get(1..).unwrap_or_default()),
                )
            }
            None => (percent_decode(piece), Vec::new()),
        })
}

/// Form fields decoded leniently (invalid UTF-8 becomes U+FFFD), as most web
/// frameworks and Twilio's helper libraries see them.
pub(crate) fn decode_form_lossy(body: &[u8]) -> Vec<(String, String)> {
    form_pairs(body)
        .map(|(n, v)| {
            (
                String::from_utf8_lossy(&n).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect()
}

/// Form fields decoded strictly: the body and every decoded name and value
/// must be UTF-8.
pub(crate) fn decode_form(body: &[u8]) -> Result<Vec<(String, String)>, Rejection> {
    const NOT_UTF8: Rejection = Rejection::MalformedBody {
        reason: "form body or one of its fields is not valid UTF-8",
    };
    if std::str::from_utf8(body).is_err() {
        return Err(NOT_UTF8);
    }
    form_pairs(body)
        .map(
            |(n, v)| match (String::from_utf8(n), String::from_utf8(v)) {
                (Ok(n), Ok(v)) => Ok((n, v)),
                _ => Err(NOT_UTF8),
            },
        )
        .collect()
}

/// A JSON object of the form's string fields. A name given more than once
/// becomes an array of its values, in body order.
pub(crate) fn form_to_json(pairs: Vec<(String, String)>) -> Map<String, Value> {
    let mut map = Map::new();
    for (name, value) in pairs {
        match map.get_mut(&name) {
            None => {
                map.insert(name, Value::String(value));
            }
            Some(Value::Array(values)) => values.push(Value::String(value)),
            Some(existing) => {
                let first = existing.take();
                *existing = Value::Array(vec![first, Value::String(value)]);
            }
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn form_decoding() {
        let pairs = decode_form(b"a=1&b=x+y%21&&c&d=%zz&e=%4").unwrap();
        assert_eq!(
            pairs,
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y!".into()),
                ("c".into(), String::new()),
                ("d".into(), "%zz".into()),
                ("e".into(), "%4".into()),
            ]
        );
        assert!(decode_form(b"a=%FF").is_err());
        assert!(decode_form(b"a=\xff").is_err());
        assert_eq!(
            decode_form_lossy(b"a=%FF"),
            vec![("a".into(), "\u{FFFD}".into())]
        );
    }

    #[test]
    fn repeated_names_become_arrays() {
        let map = form_to_json(decode_form(b"a=1&b=2&a=3&a=4").unwrap());
        assert_eq!(Value::Object(map), json!({"a": ["1", "3", "4"], "b": "2"}));
    }

    #[test]
    fn media_types() {
        let mut h = HeaderMap::new();
        assert_eq!(media_type(&h).unwrap(), None);
        h.insert(
            CONTENT_TYPE,
            "Application/X-WWW-Form-Urlencoded; charset=utf-8"
                .parse()
                .unwrap(),
        );
        let m = media_type(&h).unwrap();
        assert!(is_form(m.as_deref()));
        assert!(is_json(Some("application/vnd.api+json")));
        assert!(!is_json(Some("text/plain")));
        h.append(CONTENT_TYPE, "application/json".parse().unwrap());
        assert_eq!(media_type(&h).unwrap_err().code(), "duplicate_header");
    }

    proptest! {
        /// Our lenient decoder agrees with the `form_urlencoded` crate.
        #[test]
        fn lossy_decoding_matches_form_urlencoded(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let ours = decode_form_lossy(&body);
            let theirs: Vec<(String, String)> = form_urlencoded::parse(&body)
                .map(|(n, v)| (n.into_owned(), v.into_owned()))
                .collect();
            prop_assert_eq!(ours, theirs);
        }

        /// Strict decoding never panics and agrees with lenient decoding when it succeeds.
        #[test]
        fn strict_decoding_is_consistent(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(pairs) = decode_form(&body) {
                prop_assert_eq!(pairs, decode_form_lossy(&body));
            }
        }
    }
}
