//! The query of `GET /v1/events`, parsed strictly: an unknown, repeated,
//! malformed or out-of-range parameter is a 400, never a panic.
//!
//! Parameters as documented in <https://docs.stripe.com/api/events/list>:
//! `limit` (1 to 100, default 10), `starting_after` / `ending_before`
//! (mutually exclusive, <https://docs.stripe.com/api/pagination>), `type`
//! (one name, or a group with `*` as a wildcard), `types` (up to 20 names;
//! "You may pass either `type` or `types`, but not both"), `created` (an
//! integer or `created[gt|gte|lt|lte]`), `delivery_success` (boolean),
//! `expand` (accepted, nothing to expand here). `delivery_success=false`
//! lists the events "unsuccessfully delivered to at least one of your webhook
//! endpoints" (still pending, or given up), as the recovery guide uses it
//! with `ending_before` and `types[]`:
//! <https://docs.stripe.com/webhooks/process-undelivered-events>. Arrays arrive as `types[]=`
//! or indexed `types[0]=` (stripe-python's encoding).

use super::errors::ApiError;

/// Default page size. <https://docs.stripe.com/api/pagination>
pub const DEFAULT_LIMIT: u32 = 10;
/// Largest page size.
pub const MAX_LIMIT: u32 = 100;
/// Most entries of `types`. <https://docs.stripe.com/api/events/list>
pub const MAX_TYPES: usize = 20;

/// Which way a page is cut from the newest-first list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// The first page (the newest events).
    None,
    /// Events older than this id (the next page).
    StartingAfter(String),
    /// Events newer than this id (the previous page).
    EndingBefore(String),
}

/// Bounds on `created`, inclusive and exclusive, in Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreatedRange {
    /// `created[gt]`.
    pub gt: Option<i64>,
    /// `created[gte]` (or `created=` exactly, with `lte`).
    pub gte: Option<i64>,
    /// `created[lt]`.
    pub lt: Option<i64>,
    /// `created[lte]`.
    pub lte: Option<i64>,
}

impl CreatedRange {
    /// Whether `created` lies within every bound given.
    pub fn contains(&self, created: i64) -> bool {
        self.gt.is_none_or(|b| created > b)
            && self.gte.is_none_or(|b| created >= b)
            && self.lt.is_none_or(|b| created < b)
            && self.lte.is_none_or(|b| created <= b)
    }
}

/// Which event types are asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeFilter {
    /// Every type.
    Any,
    /// `type=`: one name, where `*` matches any run of characters.
    Pattern(String),
    /// `types[]=`: any of these exact names.
    OneOf(Vec<String>),
}

impl TypeFilter {
    /// Whether an event of `kind` passes.
    pub fn matches(&self, kind: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Pattern(pattern) => wildcard_match(pattern, kind),
            Self::OneOf(kinds) => kinds.iter().any(|k| k == kind),
        }
    }
}

/// A parsed `GET /v1/events` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListParams {
    /// Page size, 1..=100.
    pub limit: u32,
    /// Where the page starts.
    pub cursor: Cursor,
    /// Type filter.
    pub types: TypeFilter,
    /// Creation-time bounds.
    pub created: CreatedRange,
    /// `delivery_success`, when given.
    pub delivery_success: Option<bool>,
}

/// `*` matches any (possibly empty) run of characters; everything else
/// matches itself.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    true
}

fn unknown(key: &str) -> ApiError {
    ApiError::invalid(key, format!("Received unknown parameter: {key}"))
}

fn parse_integer(key: &str, value: &str) -> Result<i64, ApiError> {
    value
        .parse::<i64>()
        .map_err(|_| ApiError::invalid(key, format!("Invalid integer: {value}")))
}

fn non_empty(key: &str, value: String) -> Result<String, ApiError> {
    if value.is_empty() {
        return Err(ApiError::invalid(
            key,
            format!("Invalid {key}: must be a non-empty string"),
        ));
    }
    Ok(value)
}

/// Whether `key` is `name[]` or `name[<digits>]`.
fn is_array_key(key: &str, name: &str) -> bool {
    key.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('['))
        .and_then(|rest| rest.strip_suffix(']'))
        .is_some_and(|index| index.bytes().all(|b| b.is_ascii_digit()))
}

/// Set a scalar once: a repeated parameter is a 400.
fn set_once<T>(slot: &mut Option<T>, key: &str, value: T) -> Result<(), ApiError> {
    if slot.replace(value).is_some() {
        return Err(ApiError::invalid(
            key,
            format!("Received duplicate parameter: {key}"),
        ));
    }
    Ok(())
}

/// Only `expand[]` is accepted on `GET /v1/events/{id}`.
pub fn parse_retrieve(query: &str) -> Result<(), ApiError> {
    for (key, _) in form_urlencoded::parse(query.as_bytes()) {
        if key != "expand" && !is_array_key(&key, "expand") {
            return Err(unknown(&key));
        }
    }
    Ok(())
}

/// Parse the raw query string of `GET /v1/events`.
pub fn parse_list(query: &str) -> Result<ListParams, ApiError> {
    let mut limit = None;
    let mut starting_after = None;
    let mut ending_before = None;
    let mut kind = None;
    let mut kinds: Option<Vec<String>> = None;
    let mut created_exact = None;
    let mut created = CreatedRange::default();
    let mut delivery_success = None;

    for (key, value) in form_urlencoded::parse(query.as_bytes()) {
        let (key, value) = (key.into_owned(), value.into_owned());
        match key.as_str() {
            "limit" => {
                let n = parse_integer(&key, &value)?;
                if n < 1 {
                    return Err(ApiError::invalid(
                        &key,
                        "This value must be greater than or equal to 1.",
                    ));
                }
                if n > i64::from(MAX_LIMIT) {
                    return Err(ApiError::invalid(
                        &key,
                        format!("This value must be less than or equal to {MAX_LIMIT}."),
                    ));
                }
                // 1..=100 fits.
                set_once(&mut limit, &key, n as u32)?;
            }
            "starting_after" => set_once(&mut starting_after, &key, non_empty(&key, value)?)?,
            "ending_before" => set_once(&mut ending_before, &key, non_empty(&key, value)?)?,
            "type" => set_once(&mut kind, &key, non_empty(&key, value)?)?,
            "created" => set_once(&mut created_exact, &key, parse_integer(&key, &value)?)?,
            "created[gt]" => set_once(&mut created.gt, &key, parse_integer(&key, &value)?)?,
            "created[gte]" => set_once(&mut created.gte, &key, parse_integer(&key, &value)?)?,
            "created[lt]" => set_once(&mut created.lt, &key, parse_integer(&key, &value)?)?,
            "created[lte]" => set_once(&mut created.lte, &key, parse_integer(&key, &value)?)?,
            "delivery_success" => {
                let flag = match value.as_str() {
                    "true" => true,
                    "false" => false,
                    other => {
                        return Err(ApiError::invalid(&key, format!("Invalid boolean: {other}")))
                    }
                };
                set_once(&mut delivery_success, &key, flag)?;
            }
            "expand" => {}
            _ if is_array_key(&key, "expand") => {}
            _ if is_array_key(&key, "types") => {
                let list = kinds.get_or_insert_with(Vec::new);
                list.push(non_empty("types", value)?);
                if list.len() > MAX_TYPES {
                    return Err(ApiError::invalid(
                        "types",
                        format!("Invalid array: `types` may contain at most {MAX_TYPES} elements."),
                    ));
                }
            }
            _ => return Err(unknown(&key)),
        }
    }

    let cursor = match (starting_after, ending_before) {
        (Some(_), Some(_)) => {
            return Err(ApiError::InvalidRequest {
                message: "Received both starting_after and ending_before parameters. Please pass in only one.".to_owned(),
                param: None,
            })
        }
        (Some(id), None) => Cursor::StartingAfter(id),
        (None, Some(id)) => Cursor::EndingBefore(id),
        (None, None) => Cursor::None,
    };
    let types = match (kind, kinds) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "types",
                "You may pass either `type` or `types`, but not both.",
            ))
        }
        (Some(pattern), None) => TypeFilter::Pattern(pattern),
        (None, Some(list)) => TypeFilter::OneOf(list),
        (None, None) => TypeFilter::Any,
    };
    if let Some(exact) = created_exact {
        if created != CreatedRange::default() {
            return Err(ApiError::invalid(
                "created",
                "Pass `created` either as an integer or as a hash of gt, gte, lt, lte, not both.",
            ));
        }
        created.gte = Some(exact);
        created.lte = Some(exact);
    }
    Ok(ListParams {
        limit: limit.unwrap_or(DEFAULT_LIMIT),
        cursor,
        types,
        created,
        delivery_success,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards() {
        assert!(wildcard_match("invoice.*", "invoice.paid"));
        assert!(!wildcard_match("invoice.*", "charge.succeeded"));
        assert!(wildcard_match("*.succeeded", "charge.succeeded"));
        assert!(wildcard_match("*", "x"));
        assert!(wildcard_match("a*b*c", "aXbYc"));
        assert!(!wildcard_match("a*b*c", "ac"));
        assert!(wildcard_match("invoice.paid", "invoice.paid"));
    }

    #[test]
    fn strict_values() {
        assert!(parse_list("limit=abc").is_err());
        assert!(parse_list("limit=0").is_err());
        assert!(parse_list("limit=101").is_err());
        assert!(parse_list("limit=99999999999999999999999").is_err());
        assert!(parse_list("limit=1&limit=2").is_err());
        assert!(parse_list("foo=1").is_err());
        assert!(parse_list("created[foo]=1").is_err());
        assert!(parse_list("types[x]=a").is_err());
        assert!(parse_list("created=1&created[gt]=0").is_err());
        assert!(parse_list("delivery_success=yes").is_err());
        assert!(parse_list("%ff%fe=%ff").is_err());
        let ok = parse_list("types[0]=a&types[]=b&created[gte]=5&limit=100").expect("valid");
        assert_eq!(ok.types, TypeFilter::OneOf(vec!["a".into(), "b".into()]));
        assert_eq!(ok.created.gte, Some(5));
        assert_eq!(ok.limit, 100);
    }
}
