//! Shared body helpers: media type, JSON and `application/x-www-form-urlencoded`
//! parsing. Only ever called after the signature has been verified (except
//! Twilio's lenient form decoding, which the signature is computed over: so
//! every form is counted before it is decoded, and refused when it has more
//! than [`MAX_FORM_FIELDS`]).

use std::borrow::Cow;

use http::{header::CONTENT_TYPE, HeaderMap};
use serde_json::{Map, Value};

use super::signature::one_header;
use super::{Rejection, MAX_FORM_FIELDS};

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

/// Refuse a form with more than [`MAX_FORM_FIELDS`] fields, counted without
/// decoding or allocating anything (fields as `form_urlencoded` splits them:
/// on `&`, empty pieces skipped). A body of a million `a&a&…` would
/// otherwise become a million decoded pairs before anything could tell
/// whether it was signed.
pub(crate) fn check_form_fields(body: &[u8]) -> Result<(), Rejection> {
    let fields = body
        .split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .take(MAX_FORM_FIELDS + 1)
        .count();
    if fields > MAX_FORM_FIELDS {
        return Err(Rejection::TooManyFormFields {
            limit: MAX_FORM_FIELDS,
        });
    }
    Ok(())
}

/// A form field's name and value, borrowed from the body where nothing
/// needed decoding.
pub(crate) type FormField<'body> = (Cow<'body, str>, Cow<'body, str>);

/// Form fields decoded leniently (invalid UTF-8 becomes U+FFFD), as most web
/// frameworks and Twilio's helper libraries see them: `form_urlencoded`'s
/// own parser (the WHATWG `application/x-www-form-urlencoded` parser). A
/// field with nothing to decode borrows from the body. At most
/// [`MAX_FORM_FIELDS`] fields.
pub(crate) fn decode_form_lossy(body: &[u8]) -> Result<Vec<FormField<'_>>, Rejection> {
    check_form_fields(body)?;
    Ok(form_urlencoded::parse(body).collect())
}

/// Form fields decoded strictly: the body and every decoded name and value
/// must be UTF-8. `form_urlencoded` only decodes leniently, and a payload
/// whose fields silently became U+FFFD is not what was signed: so the pairs
/// are split as it splits them (on `&`, then the first `=`, empty pieces
/// skipped) and each is decoded with `percent-encoding`, the crate
/// `form_urlencoded` decodes with, strictly.
pub(crate) fn decode_form(body: &[u8]) -> Result<Vec<(String, String)>, Rejection> {
    const NOT_UTF8: Rejection = Rejection::MalformedBody {
        reason: "form body or one of its fields is not valid UTF-8",
    };
    check_form_fields(body)?;
    if std::str::from_utf8(body).is_err() {
        return Err(NOT_UTF8);
    }
    let strict = |raw: &[u8]| -> Result<String, Rejection> {
        let plus_as_space: Vec<u8> = raw
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        percent_encoding::percent_decode(&plus_as_space)
            .decode_utf8()
            .map(|text| text.into_owned())
            .map_err(|_| NOT_UTF8)
    };
    body.split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| {
            let mut halves = piece.splitn(2, |&b| b == b'=');
            let name = halves.next().unwrap_or_default();
            let value = halves.next().unwrap_or_default();
            Ok((strict(name)?, strict(value)?))
        })
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
            decode_form_lossy(b"a=%FF").unwrap(),
            vec![("a".into(), "\u{FFFD}".into())]
        );
    }

    #[test]
    fn forms_with_too_many_fields_are_refused_before_decoding() {
        let most = "a=1&".repeat(MAX_FORM_FIELDS);
        assert_eq!(decode_form(most.as_bytes()).unwrap().len(), MAX_FORM_FIELDS);
        assert_eq!(
            decode_form_lossy(most.as_bytes()).unwrap().len(),
            MAX_FORM_FIELDS
        );
        // Empty pieces are not fields, as form_urlencoded skips them.
        let padded = format!("{most}&&&&");
        assert!(check_form_fields(padded.as_bytes()).is_ok());
        let one_more = format!("{most}b");
        for refused in [
            check_form_fields(one_more.as_bytes()).unwrap_err(),
            decode_form(one_more.as_bytes()).unwrap_err(),
            decode_form_lossy(one_more.as_bytes()).unwrap_err(),
        ] {
            assert_eq!(refused.code(), "too_many_form_fields");
            assert_eq!(refused.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        }
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
        /// Any pairs of text, encoded by `form_urlencoded`, decode strictly
        /// to themselves.
        #[test]
        fn strict_decoding_round_trips(pairs in proptest::collection::vec(("\\PC{1,8}", "\\PC{0,8}"), 0..6)) {
            let mut serializer = form_urlencoded::Serializer::new(String::new());
            for (name, value) in &pairs {
                serializer.append_pair(name, value);
            }
            let body = serializer.finish();
            prop_assert_eq!(decode_form(body.as_bytes()).unwrap(), pairs);
        }

        /// Strict decoding never panics and agrees with lenient decoding when it succeeds.
        #[test]
        fn strict_decoding_is_consistent(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(pairs) = decode_form(&body) {
                let lossy: Vec<(String, String)> = decode_form_lossy(&body)
                    .unwrap()
                    .into_iter()
                    .map(|(name, value)| (name.into_owned(), value.into_owned()))
                    .collect();
                prop_assert_eq!(pairs, lossy);
            }
        }
    }
}
