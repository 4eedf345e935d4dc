//! Several hosts in one PostgreSQL URL, as libpq accepts them:
//! `postgres://user@host1:5432,host2:5432/db?target_session_attrs=read-write`.
//!
//! sqlx's options take one host, so the list is split here into one URL per
//! host — the same user, database and parameters — and each is handed to
//! sqlx's own parser. Written by hand rather than with the `url` crate, which
//! refuses a host list. Only tickmark's own parameters are read here and
//! removed: `target_session_attrs`, `pooler` and `listen_url` (`pooler.rs`);
//! everything else (passwords, `sslmode`, `application_name`…) stays sqlx's
//! business.

use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;

use super::pooler::Pooler;
use tickmark_driver::store::StoreError;

/// Which server a connection may use (`target_session_attrs`, as in libpq).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SessionAttrs {
    /// Any server that accepts the connection (libpq's default).
    Any,
    /// Only a server that accepts writes: not in recovery, not read-only
    /// (`read-write`; `primary` is taken to mean the same).
    ReadWrite,
}

/// One host of the list.
#[derive(Debug, Clone)]
pub(super) struct Host {
    /// `host:port` as written, for logs.
    pub(super) name: String,
    /// The URL of this host alone, with the list's user, database and
    /// parameters (`target_session_attrs` removed).
    pub(super) url: String,
}

impl Host {
    /// sqlx's options for this host.
    pub(super) fn options(&self) -> Result<PgConnectOptions, StoreError> {
        Ok(PgConnectOptions::from_str(&self.url)?)
    }
}

/// A database URL's hosts, in the order they are tried.
#[derive(Debug, Clone)]
pub(super) struct HostList {
    /// At least one.
    pub(super) hosts: Vec<Host>,
    /// What each connection must find on its server.
    pub(super) attrs: SessionAttrs,
    /// The URL's `pooler` parameter, if it has one.
    pub(super) pooler: Option<Pooler>,
    /// The URL's `listen_url` parameter (percent-decoded), if it has one.
    pub(super) listen_url: Option<String>,
}

impl HostList {
    /// Split `url` into its hosts. A URL with one host (or none: a Unix
    /// socket) comes back as it is, less tickmark's parameters.
    pub(super) fn parse(url: &str) -> Result<HostList, StoreError> {
        let (without_attrs, params) = take_params(url)?;
        let Some(scheme_end) = without_attrs.find("://") else {
            return Ok(HostList::one(without_attrs, params));
        };
        let authority_start = scheme_end + 3;
        let rest = &without_attrs[authority_start..];
        let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_len];
        // The user info ends at the last `@` of the authority (an unencoded
        // `@` in a password is taken as part of it, as `redact_url` does).
        let (user_info, host_list) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        if !host_list.contains(',') {
            return Ok(HostList::one(without_attrs, params));
        }
        let scheme_and_user = format!("{}{user_info}", &without_attrs[..authority_start]);
        let after = &rest[authority_len..];
        let hosts = host_list
            .split(',')
            .map(|name| {
                if name.is_empty() || name.starts_with(':') {
                    return Err(config_error(format!(
                        "the host list `{}` has an empty host; write each as host or host:port, \
                         separated by commas",
                        host_list
                    )));
                }
                Ok(Host {
                    name: name.to_owned(),
                    url: format!("{scheme_and_user}{name}{after}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(HostList {
            hosts,
            attrs: params.attrs,
            pooler: params.pooler,
            listen_url: params.listen_url,
        })
    }

    fn one(url: String, params: Params) -> HostList {
        HostList {
            hosts: vec![Host {
                name: host_name(&url),
                url,
            }],
            attrs: params.attrs,
            pooler: params.pooler,
            listen_url: params.listen_url,
        }
    }
}

/// tickmark's own parameters of a URL.
struct Params {
    attrs: SessionAttrs,
    pooler: Option<Pooler>,
    listen_url: Option<String>,
}

/// The URL without tickmark's parameters, and what they asked for.
fn take_params(url: &str) -> Result<(String, Params), StoreError> {
    let mut params = Params {
        attrs: SessionAttrs::Any,
        pooler: None,
        listen_url: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), params));
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let mut kept = Vec::new();
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some(("target_session_attrs", value)) => {
                params.attrs = match value {
                    "any" => SessionAttrs::Any,
                    "read-write" | "primary" => SessionAttrs::ReadWrite,
                    other => return Err(unsupported_attrs(other)),
                }
            }
            Some(("pooler", value)) => {
                params.pooler = Some(Pooler::parse(value).ok_or_else(|| {
                    config_error(format!(
                        "pooler={value} is not supported: use transaction (PgBouncer's \
                         pool_mode = transaction), session, or none"
                    ))
                })?);
            }
            Some(("listen_url", value)) => params.listen_url = Some(percent_decode(value)?),
            _ if pair.is_empty() => {}
            _ => kept.push(pair),
        }
    }
    let mut out = base.to_owned();
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        out.push('#');
        out.push_str(fragment);
    }
    Ok((out, params))
}

/// `%XX` escapes decoded (a `listen_url` with `&`, `#` or `?` in it must be
/// written escaped, as any URL parameter's value).
fn percent_decode(value: &str) -> Result<String, StoreError> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
                .ok_or_else(|| {
                    config_error("listen_url has a `%` not followed by two hex digits".into())
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| config_error("listen_url is not UTF-8 once decoded".into()))
}

/// `host:port` of a one-host URL, for logs (`local socket` when none).
fn host_name(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let host = authority
        .rfind('@')
        .map_or(authority, |at| &authority[at + 1..]);
    if host.is_empty() {
        "local socket".to_owned()
    } else {
        host.to_owned()
    }
}

fn unsupported_attrs(value: &str) -> StoreError {
    config_error(format!(
        "target_session_attrs={value} is not supported: tickmark writes, so use read-write \
         (or primary) to follow the primary, or any"
    ))
}

fn config_error(message: String) -> StoreError {
    StoreError::Database(sqlx::Error::Configuration(message.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(list: &HostList) -> Vec<&str> {
        list.hosts.iter().map(|h| h.url.as_str()).collect()
    }

    #[test]
    fn a_host_list_becomes_one_url_per_host_with_the_same_user_database_and_parameters() {
        let list = HostList::parse(
            "postgres://app:s3cret@db1:5432,db2:5433,[::1]:5434/prod?sslmode=disable\
             &target_session_attrs=read-write&application_name=web",
        )
        .unwrap();
        assert_eq!(list.attrs, SessionAttrs::ReadWrite);
        assert_eq!(
            urls(&list),
            [
                "postgres://app:s3cret@db1:5432/prod?sslmode=disable&application_name=web",
                "postgres://app:s3cret@db2:5433/prod?sslmode=disable&application_name=web",
                "postgres://app:s3cret@[::1]:5434/prod?sslmode=disable&application_name=web",
            ]
        );
        let names: Vec<&str> = list.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["db1:5432", "db2:5433", "[::1]:5434"]);
        for host in &list.hosts {
            host.options().expect("sqlx parses each host's URL");
        }
    }

    #[test]
    fn hosts_without_ports_user_or_database_are_kept_as_written() {
        let list = HostList::parse("postgresql://a,b").unwrap();
        assert_eq!(urls(&list), ["postgresql://a", "postgresql://b"]);
        assert_eq!(list.attrs, SessionAttrs::Any);
        let list = HostList::parse("postgres://u@a,b:6000?target_session_attrs=primary").unwrap();
        assert_eq!(urls(&list), ["postgres://u@a", "postgres://u@b:6000"]);
        assert_eq!(list.attrs, SessionAttrs::ReadWrite);
    }

    #[test]
    fn one_host_is_passed_through_less_target_session_attrs() {
        for (url, expected, attrs) in [
            (
                "postgres://u:p@h:1/db?sslmode=require",
                "postgres://u:p@h:1/db?sslmode=require",
                SessionAttrs::Any,
            ),
            (
                "postgres://u@h/db?target_session_attrs=read-write",
                "postgres://u@h/db",
                SessionAttrs::ReadWrite,
            ),
            (
                "postgres://u@h/db?target_session_attrs=any&sslmode=disable",
                "postgres://u@h/db?sslmode=disable",
                SessionAttrs::Any,
            ),
            ("postgres:///db", "postgres:///db", SessionAttrs::Any),
        ] {
            let list = HostList::parse(url).unwrap();
            assert_eq!(urls(&list), [expected], "{url}");
            assert_eq!(list.attrs, attrs, "{url}");
        }
        assert_eq!(
            HostList::parse("postgres:///db").unwrap().hosts[0].name,
            "local socket"
        );
        assert_eq!(
            HostList::parse("postgres://u:p@h:1/db").unwrap().hosts[0].name,
            "h:1"
        );
    }

    #[test]
    fn pooler_and_listen_url_are_read_and_removed() {
        let list = HostList::parse(
            "postgres://u@pgbouncer:6432/db?pooler=transaction&sslmode=disable\
             &listen_url=postgres%3A%2F%2Fu%40db%3A5432%2Fdb%3Fsslmode%3Ddisable",
        )
        .unwrap();
        assert_eq!(
            urls(&list),
            ["postgres://u@pgbouncer:6432/db?sslmode=disable"]
        );
        assert_eq!(list.pooler, Some(Pooler::Transaction));
        assert_eq!(
            list.listen_url.as_deref(),
            Some("postgres://u@db:5432/db?sslmode=disable")
        );
        let list = HostList::parse("postgres://a,b/db?pooler=session").unwrap();
        assert_eq!(urls(&list), ["postgres://a/db", "postgres://b/db"]);
        assert_eq!(list.pooler, Some(Pooler::Session));
        assert_eq!(HostList::parse("postgres://a/db").unwrap().pooler, None);
        for (url, says) in [
            (
                "postgres://a/db?pooler=statement",
                "pooler=statement is not supported",
            ),
            ("postgres://a/db?listen_url=%zz", "two hex digits"),
        ] {
            let error = HostList::parse(url).expect_err(url).to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }

    #[test]
    fn an_at_sign_in_the_password_stays_in_the_user_info() {
        let list = HostList::parse("postgres://u:p@ss@h1,h2/db").unwrap();
        assert_eq!(
            urls(&list),
            ["postgres://u:p@ss@h1/db", "postgres://u:p@ss@h2/db"]
        );
    }

    #[test]
    fn unsupported_session_attrs_and_empty_hosts_are_refused_clearly() {
        for (url, says) in [
            (
                "postgres://a,b/db?target_session_attrs=standby",
                "target_session_attrs=standby is not supported",
            ),
            (
                "postgres://a,b/db?target_session_attrs=read-only",
                "use read-write",
            ),
            ("postgres://a,,b/db", "has an empty host"),
            ("postgres://a,:5432/db", "has an empty host"),
        ] {
            let error = HostList::parse(url).expect_err(url).to_string();
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}
