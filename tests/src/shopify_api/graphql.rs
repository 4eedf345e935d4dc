//! The little GraphQL the fake understands: a POSTed JSON body
//! `{"query", "variables", "operationName"}`
//! (<https://shopify.dev/docs/api/admin-graphql#endpoints>), whose query
//! selects `webhookSubscriptions(first: …, after: …)`
//! (<https://shopify.dev/docs/api/admin-graphql/latest/queries/webhookSubscriptions>).
//!
//! Not a GraphQL parser: the arguments of `webhookSubscriptions(…)` are read
//! (literals or `$variables`), and a node field is returned when the query
//! names it. Any other query is answered with a GraphQL error.

use serde_json::{Map, Value};

/// Most items one connection page holds on Shopify.
pub const MAX_PAGE: u64 = 250;

/// Why a GraphQL request was not answered with data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphqlError {
    /// The body is not a JSON object with a string `query`: HTTP 400.
    #[error("Required parameter missing or invalid")]
    BadRequest,
    /// A query the fake does not implement, or bad arguments: a GraphQL
    /// error in a 200 answer.
    #[error("{0}")]
    Query(String),
}

/// The request body.
#[derive(Debug, Clone)]
pub(crate) struct GraphqlRequest {
    pub query: String,
    pub variables: Map<String, Value>,
}

impl GraphqlRequest {
    /// Parse the raw body strictly.
    pub fn parse(body: &[u8]) -> Result<Self, GraphqlError> {
        let value: Value = serde_json::from_slice(body).map_err(|_| GraphqlError::BadRequest)?;
        let query = value
            .get("query")
            .and_then(Value::as_str)
            .ok_or(GraphqlError::BadRequest)?
            .to_owned();
        let variables = match value.get("variables") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) => map.clone(),
            Some(_) => return Err(GraphqlError::BadRequest),
        };
        Ok(Self { query, variables })
    }

    /// Whether the query names `word` as a whole identifier.
    pub fn names(&self, word: &str) -> bool {
        identifiers(&self.query).any(|ident| ident == word)
    }

    /// The `webhookSubscriptions` arguments: `first` (1–250) and `after`.
    pub fn subscriptions_args(&self) -> Result<(u64, Option<String>), GraphqlError> {
        let args = arguments(&self.query, "webhookSubscriptions").unwrap_or_default();
        let mut first = None;
        let mut after = None;
        for (name, raw) in args {
            let value = match raw.strip_prefix('$') {
                Some(variable) => self.variables.get(variable).cloned().unwrap_or(Value::Null),
                None => literal(&raw)?,
            };
            match name.as_str() {
                "first" => first = value.as_u64().map(Some).unwrap_or(None).or(first),
                "after" => after = value.as_str().map(str::to_owned),
                "last" | "before" => {
                    return Err(GraphqlError::Query(format!(
                        "`{name}` is not implemented by this fake (page forward with first/after)"
                    )))
                }
                _ => {}
            }
        }
        let first = first
            .ok_or_else(|| GraphqlError::Query("you must provide one of first or last".into()))?;
        if first == 0 || first > MAX_PAGE {
            return Err(GraphqlError::Query(format!(
                "The maximum number of items that can be requested is {MAX_PAGE}; first was {first}"
            )));
        }
        Ok((first, after))
    }
}

/// The identifiers in `text`, skipping string literals.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || loop {
        let start = rest.find(|c: char| c.is_ascii_alphabetic() || c == '_' || c == '"')?;
        rest = &rest[start..];
        if let Some(after_quote) = rest.strip_prefix('"') {
            let end = after_quote.find('"').map_or(after_quote.len(), |i| i + 1);
            rest = &after_quote[end..];
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let (ident, tail) = rest.split_at(end);
        rest = tail;
        return Some(ident);
    })
}

/// The `name: value` pairs inside `field(…)`, values as raw text.
fn arguments(query: &str, field: &str) -> Option<Vec<(String, String)>> {
    let mut from = 0;
    let open = loop {
        let at = from + query[from..].find(field)?;
        let before_ok = query[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &query[at + field.len()..];
        let after_ok = !tail.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        if before_ok && after_ok {
            break tail.trim_start();
        }
        from = at + field.len();
    };
    let inner = open.strip_prefix('(')?;
    let inner = &inner[..inner.find(')')?];
    let mut pairs = Vec::new();
    for part in split_arguments(inner) {
        if let Some((name, value)) = part.split_once(':') {
            pairs.push((name.trim().to_owned(), value.trim().to_owned()));
        }
    }
    Some(pairs)
}

/// Split an argument list on commas and line breaks, outside string
/// literals (GraphQL's commas are optional: arguments on one line need them
/// here).
fn split_arguments(inner: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut in_string = false;
    for c in inner.chars() {
        match c {
            '"' => {
                in_string = !in_string;
                current.push(c);
            }
            ',' | '\n' if !in_string => {
                parts.push(std::mem::take(&mut current));
            }
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// A literal argument value: an integer, a string, `null`.
fn literal(raw: &str) -> Result<Value, GraphqlError> {
    if raw == "null" {
        return Ok(Value::Null);
    }
    serde_json::from_str(raw)
        .map_err(|_| GraphqlError::Query(format!("cannot read argument value `{raw}`")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(query: &str, variables: Value) -> GraphqlRequest {
        GraphqlRequest::parse(
            serde_json::to_string(&serde_json::json!({"query": query, "variables": variables}))
                .unwrap()
                .as_bytes(),
        )
        .unwrap()
    }

    #[test]
    fn reads_literals_and_variables() {
        let r = request(
            "{ webhookSubscriptions(first: 5, after: \"abc\") { edges { cursor } } }",
            Value::Null,
        );
        assert_eq!(r.subscriptions_args().unwrap(), (5, Some("abc".into())));
        let r = request(
            "query Subs($n: Int!, $c: String) { webhookSubscriptions(first: $n, after: $c) { edges { cursor } } }",
            serde_json::json!({"n": 2, "c": null}),
        );
        assert_eq!(r.subscriptions_args().unwrap(), (2, None));
        assert!(r.names("cursor"));
        assert!(!r.names("webhookSubscription"));
    }

    #[test]
    fn refuses_what_it_cannot_answer() {
        assert_eq!(
            GraphqlRequest::parse(b"not json").unwrap_err(),
            GraphqlError::BadRequest
        );
        let r = request("{ webhookSubscriptions { edges { cursor } } }", Value::Null);
        assert!(r.subscriptions_args().is_err());
        let r = request(
            "{ webhookSubscriptions(first: 251) { edges { cursor } } }",
            Value::Null,
        );
        assert!(r.subscriptions_args().is_err());
    }
}
