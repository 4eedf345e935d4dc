//! Who may read and act: every page and `/metrics` need the token.
//!
//! A request proves it holds the token in one of three ways:
//!
//! - `Authorization: Bearer <token>`: scripts, curl, Prometheus;
//! - the session cookie a browser gets by signing in through the login form
//!   ([`session`]); its state-changing forms then carry the session's CSRF
//!   token;
//! - the retry form's `token` field (typed by the operator).
//!
//! The [`guard`] middleware lets a page through only with a bearer token or
//! a valid session, and otherwise answers 401 with the login form as the
//! body. POSTs pass the guard and check their own credentials, since those
//! travel in the form's body ([`Auth::authorize_action`]). Without a token
//! configured the dashboard shows nothing and does nothing: pages and
//! actions answer 401 with a page that says how to configure one.

mod session;
mod token;

use std::sync::Arc;

use axum::extract::{OriginalUri, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::html::{Chrome, Page};
use super::links::Base;
use super::login;
use super::Shared;
pub(crate) use session::{clear_cookie, set_cookie, unix_now};
use session::{cookies, Sessions};
pub use token::Token;

/// The token and the key that signs browser sessions.
#[derive(Debug, Clone)]
pub(crate) struct Auth {
    token: Token,
    sessions: Sessions,
}

/// How a request proved that it holds the token.
#[derive(Debug, Clone)]
pub enum Access {
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The session cookie; forms must carry `csrf`.
    Session {
        /// The session's CSRF token, for the page's forms.
        csrf: String,
    },
    /// Nothing: only the login page and the POST routes (which check the
    /// form themselves) are reached this way.
    Anonymous,
}

impl Access {
    /// The CSRF token a signed-in browser's forms carry.
    pub fn csrf(&self) -> Option<&str> {
        match self {
            Access::Session { csrf } => Some(csrf),
            Access::Bearer | Access::Anonymous => None,
        }
    }
}

/// Why an action was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No bearer token, no right `token` field, no session.
    NoCredentials,
    /// A valid session, but the form's CSRF token is missing or wrong: the
    /// form was not one of this dashboard's pages (or the page is stale).
    BadCsrf,
}

impl Auth {
    /// The token `secret`, and a fresh session key.
    pub(crate) fn new(secret: &str) -> Self {
        Self {
            token: Token::new(secret),
            sessions: Sessions::new(),
        }
    }

    /// Whether `candidate` is the token.
    pub(crate) fn token_matches(&self, candidate: &str) -> bool {
        self.token.matches(candidate)
    }

    /// A new session's cookie value.
    pub(crate) fn new_session(&self) -> String {
        self.sessions.issue(unix_now())
    }

    /// How the request's headers authenticate, if they do.
    pub(crate) fn access(&self, headers: &HeaderMap) -> Option<Access> {
        if self.token.matches_bearer(headers) {
            return Some(Access::Bearer);
        }
        self.session(headers).map(|session| Access::Session {
            csrf: self.sessions.csrf(session),
        })
    }

    /// The request's valid session cookie, if any.
    fn session<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let now = unix_now();
        cookies(headers).find(|value| self.sessions.is_valid(value, now))
    }

    /// Whether a state-changing form may act: a bearer header, the token in
    /// the form's `token` field, or a session cookie with the session's
    /// CSRF token in the form's `csrf` field.
    pub(crate) fn authorize_action(
        &self,
        headers: &HeaderMap,
        form_token: &str,
        form_csrf: &str,
    ) -> Result<(), Refusal> {
        if self.token.matches_bearer(headers) || self.token.matches(form_token) {
            return Ok(());
        }
        match self.session(headers) {
            Some(session) if self.sessions.csrf_matches(session, form_csrf) => Ok(()),
            Some(_) => Err(Refusal::BadCsrf),
            None => Err(Refusal::NoCredentials),
        }
    }
}

/// Middleware over every dashboard route: a page needs the bearer token or
/// a session; without either it answers 401 with the login form. The login
/// page itself and POSTs (which check their form) pass.
pub(crate) async fn guard(
    State(shared): State<Arc<Shared>>,
    base: Base,
    mut request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::POST {
        return next.run(request).await;
    }
    let Some(auth) = &shared.auth else {
        return no_token_configured(&base, "This dashboard shows nothing");
    };
    if let Some(access) = auth.access(request.headers()) {
        request.extensions_mut().insert(access);
        return next.run(request).await;
    }
    if request.uri().path() == "/login" {
        return next.run(request).await;
    }
    let wanted = request
        .extensions()
        .get::<OriginalUri>()
        .map(|uri| &uri.0)
        .unwrap_or(request.uri());
    let wanted = wanted
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    challenge(login::page(&base, &wanted, StatusCode::UNAUTHORIZED, None))
}

/// Middleware over `/metrics` when the dashboard's token guards it: the
/// bearer token (Prometheus's `authorization` setting) or a session.
pub(crate) async fn guard_metrics(
    State(auth): State<Arc<Auth>>,
    request: Request,
    next: Next,
) -> Response {
    if auth.access(request.headers()).is_some() {
        return next.run(request).await;
    }
    challenge(
        (
            StatusCode::UNAUTHORIZED,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            )],
            "tickmark: /metrics needs the dashboard's token: send `Authorization: Bearer <token>` \
             (Prometheus: `authorization: { credentials: … }`).\n",
        )
            .into_response(),
    )
}

/// 401 for an action, with what went wrong.
pub(crate) fn unauthorized(base: &Base, message: &str) -> Response {
    challenge(Page::message(
        Chrome {
            base: base.0.clone(),
            csrf: None,
        },
        StatusCode::UNAUTHORIZED,
        "Token required",
        message,
    ))
}

/// 401 for a dashboard that has no token: it shows and does nothing.
pub(crate) fn no_token_configured(base: &Base, what: &str) -> Response {
    unauthorized(
        base,
        &format!(
            "{what}: the dashboard has no token configured. Start it with a token \
             (`Dashboard::token`; in the payments example `--dashboard-token` or \
             TICKMARK_DASHBOARD_TOKEN). Nothing was changed."
        ),
    )
}

/// `response` with the challenge that names the scheme.
pub(crate) fn challenge(response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tickmark\""),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, String)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    #[test]
    fn actions_need_the_token_or_a_session_with_its_csrf_token() {
        let auth = Auth::new("the-token");
        let session = auth.new_session();
        let csrf = auth.sessions.csrf(&session);
        let cookie = (header::COOKIE, format!("tickmark_session={session}"));
        let bearer = (header::AUTHORIZATION, "Bearer the-token".to_owned());

        assert_eq!(auth.authorize_action(&headers(&[bearer]), "", ""), Ok(()));
        assert_eq!(
            auth.authorize_action(&HeaderMap::new(), "the-token", ""),
            Ok(())
        );
        assert_eq!(
            auth.authorize_action(&headers(std::slice::from_ref(&cookie)), "", &csrf),
            Ok(())
        );
        assert_eq!(
            auth.authorize_action(&headers(std::slice::from_ref(&cookie)), "", ""),
            Err(Refusal::BadCsrf)
        );
        assert_eq!(
            auth.authorize_action(&headers(&[cookie]), "", "0000"),
            Err(Refusal::BadCsrf)
        );
        assert_eq!(
            auth.authorize_action(&HeaderMap::new(), "", &csrf),
            Err(Refusal::NoCredentials),
            "a CSRF token without its session is nothing"
        );
        assert_eq!(
            auth.authorize_action(&HeaderMap::new(), "wrong", ""),
            Err(Refusal::NoCredentials)
        );
    }

    #[test]
    fn reads_need_the_bearer_token_or_a_valid_session() {
        let auth = Auth::new("the-token");
        let session = auth.new_session();
        let other = Auth::new("the-token").new_session();
        assert!(matches!(
            auth.access(&headers(&[(
                header::AUTHORIZATION,
                "Bearer the-token".into()
            )])),
            Some(Access::Bearer)
        ));
        assert!(matches!(
            auth.access(&headers(&[(
                header::COOKIE,
                format!("tickmark_session={session}")
            )])),
            Some(Access::Session { .. })
        ));
        for refused in [
            headers(&[(header::AUTHORIZATION, "Bearer wrong".into())]),
            headers(&[(header::COOKIE, format!("tickmark_session={other}"))]),
            headers(&[(header::COOKIE, "tickmark_session=the-token".into())]),
            HeaderMap::new(),
        ] {
            assert!(auth.access(&refused).is_none(), "{refused:?}");
        }
    }
}
