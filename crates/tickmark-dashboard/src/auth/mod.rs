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
//!
//! Every check of a presented token goes through the [`throttle`]: too many
//! wrong tokens from one address, or from everyone, and the next check is
//! answered 429 without being made.

mod client;
mod session;
mod throttle;
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
pub(crate) use client::{Client, Peer};
pub(crate) use session::{clear_cookie, set_cookie, unix_now};
use session::{cookies, Sessions};
pub use throttle::{
    FailureLimits, DEFAULT_GLOBAL, DEFAULT_PER_CLIENT, DEFAULT_WINDOW, MAX_CLIENTS,
};
use throttle::{Locked, Now, Scope, Throttle};
pub use token::Token;

/// The token, the key that signs browser sessions, and the throttle of
/// wrong tokens.
#[derive(Debug)]
pub(crate) struct Auth {
    token: Token,
    sessions: Arc<Sessions>,
    throttle: Throttle,
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
    /// Too many wrong tokens: the token was not checked (429).
    Locked(Locked),
}

impl Auth {
    /// The token `secret`, a fresh session key, and a throttle with `limits`.
    pub(crate) fn new(secret: &str, limits: FailureLimits) -> Self {
        Self {
            token: Token::new(secret),
            sessions: Arc::new(Sessions::new()),
            throttle: Throttle::new(limits, Now::default()),
        }
    }

    /// The same token and sessions, throttled with `limits` instead.
    pub(crate) fn with_limits(&self, limits: FailureLimits) -> Self {
        Self {
            token: self.token.clone(),
            sessions: Arc::clone(&self.sessions),
            throttle: Throttle::new(limits, self.throttle.clock()),
        }
    }

    /// Whether `candidate`, typed into the login form by `client`, is the
    /// token; a wrong one counts against the client. `Err` when too many
    /// wrong tokens came before: then `candidate` was not looked at.
    pub(crate) fn sign_in(&self, client: Option<Client>, candidate: &str) -> Result<bool, Locked> {
        let gate = self.throttle.gate(client)?;
        if self.token.matches(candidate) {
            return Ok(true);
        }
        gate.failed();
        Ok(false)
    }

    /// A new session's cookie value.
    pub(crate) fn new_session(&self) -> String {
        self.sessions.issue(unix_now())
    }

    /// Sign every browser out: every session issued so far is refused from
    /// now on.
    pub(crate) fn revoke_sessions(&self) {
        self.sessions.revoke_all();
    }

    /// How the request's headers authenticate, if they do. A bearer token
    /// goes through the throttle (a wrong one counts against `client`); the
    /// session cookie does not (it cannot be guessed).
    pub(crate) fn access(
        &self,
        headers: &HeaderMap,
        client: Option<Client>,
    ) -> Result<Option<Access>, Locked> {
        if let Some(candidate) = token::bearer(headers) {
            let gate = self.throttle.gate(client)?;
            if self.token.matches(candidate) {
                return Ok(Some(Access::Bearer));
            }
            gate.failed();
            tracing::warn!("dashboard: wrong bearer token");
        }
        Ok(self.session_access(headers))
    }

    /// The request's session, if it has a valid one.
    fn session_access(&self, headers: &HeaderMap) -> Option<Access> {
        self.session(headers).map(|session| Access::Session {
            csrf: self.sessions.csrf(session),
        })
    }

    /// The request's valid session cookie, if any.
    fn session<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let now = unix_now();
        cookies(headers).find(|value| self.sessions.is_valid(value, now))
    }

    /// Whether a state-changing form may act, and how the request
    /// authenticated: a bearer header, the token in the form's `token`
    /// field, or a session cookie with the session's CSRF token in the
    /// form's `csrf` field. A presented token that is wrong counts against
    /// `client` in the throttle; over budget, nothing is checked.
    pub(crate) fn authorize_action(
        &self,
        headers: &HeaderMap,
        client: Option<Client>,
        form_token: &str,
        form_csrf: &str,
    ) -> Result<Access, Refusal> {
        let bearer = token::bearer(headers);
        if bearer.is_some() || !form_token.is_empty() {
            let gate = self.throttle.gate(client).map_err(Refusal::Locked)?;
            // One guess per request: the bearer token when there is one,
            // else the form's. Checking both would give a guesser two tries
            // for each failure the throttle counts.
            let candidate = bearer.unwrap_or(form_token);
            if self.token.matches(candidate) {
                drop(gate);
                return Ok(match bearer {
                    Some(_) => Access::Bearer,
                    None => self.session_access(headers).unwrap_or(Access::Anonymous),
                });
            }
            gate.failed();
        }
        match self.session(headers) {
            Some(session) if self.sessions.csrf_matches(session, form_csrf) => {
                Ok(Access::Session {
                    csrf: self.sessions.csrf(session),
                })
            }
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
    let client = Client::of_request(request.extensions());
    match auth.access(request.headers(), client) {
        Ok(Some(access)) => {
            request.extensions_mut().insert(access);
            return next.run(request).await;
        }
        Ok(None) => {}
        Err(locked) => return too_many_wrong_tokens(&base, locked),
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
    let client = Client::of_request(request.extensions());
    match auth.access(request.headers(), client) {
        Ok(Some(_)) => return next.run(request).await,
        Ok(None) => {}
        Err(locked) => {
            return with_retry_after(
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("text/plain; charset=utf-8"),
                    )],
                    format!("tickmark: {}\n", locked_message(locked)),
                ),
                locked,
            )
        }
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

/// 429 for a request whose token was not checked: too many wrong tokens
/// came before it. `Retry-After` says when to try again.
pub(crate) fn too_many_wrong_tokens(base: &Base, locked: Locked) -> Response {
    with_retry_after(
        Page::message(
            Chrome {
                base: base.0.clone(),
                csrf: None,
            },
            StatusCode::TOO_MANY_REQUESTS,
            "Too many wrong tokens",
            &locked_message(locked),
        ),
        locked,
    )
}

/// What a 429 says: whose budget, how long, and that nothing was checked.
fn locked_message(locked: Locked) -> String {
    let whose = match locked.scope {
        Scope::Client => "from your address",
        Scope::Global => "from all clients together",
    };
    format!(
        "Too many wrong tokens were presented {whose}. The token was not checked and nothing \
         was changed; try again in {} seconds.",
        locked.retry_after_secs()
    )
}

/// `response` with `Retry-After` from `locked`.
fn with_retry_after(response: impl IntoResponse, locked: Locked) -> Response {
    let mut response = response.into_response();
    response.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(locked.retry_after_secs()),
    );
    response
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

    /// Whether an action was allowed, whatever the access.
    fn allowed(decision: Result<Access, Refusal>) -> Result<(), Refusal> {
        decision.map(|_| ())
    }

    #[test]
    fn actions_need_the_token_or_a_session_with_its_csrf_token() {
        let auth = Auth::new("the-token", FailureLimits::default());
        let session = auth.new_session();
        let csrf = auth.sessions.csrf(&session);
        let cookie = (header::COOKIE, format!("tickmark_session={session}"));
        let bearer = (header::AUTHORIZATION, "Bearer the-token".to_owned());

        assert_eq!(
            allowed(auth.authorize_action(&headers(&[bearer]), None, "", "")),
            Ok(())
        );
        assert_eq!(
            allowed(auth.authorize_action(&HeaderMap::new(), None, "the-token", "")),
            Ok(())
        );
        assert_eq!(
            allowed(auth.authorize_action(
                &headers(std::slice::from_ref(&cookie)),
                None,
                "",
                &csrf
            )),
            Ok(())
        );
        assert_eq!(
            allowed(auth.authorize_action(&headers(std::slice::from_ref(&cookie)), None, "", "")),
            Err(Refusal::BadCsrf)
        );
        assert_eq!(
            allowed(auth.authorize_action(&headers(&[cookie]), None, "", "0000")),
            Err(Refusal::BadCsrf)
        );
        assert_eq!(
            allowed(auth.authorize_action(&HeaderMap::new(), None, "", &csrf)),
            Err(Refusal::NoCredentials),
            "a CSRF token without its session is nothing"
        );
        assert_eq!(
            allowed(auth.authorize_action(&HeaderMap::new(), None, "wrong", "")),
            Err(Refusal::NoCredentials)
        );
    }

    #[test]
    fn reads_need_the_bearer_token_or_a_valid_session() {
        let auth = Auth::new("the-token", FailureLimits::default());
        let session = auth.new_session();
        let other = Auth::new("the-token", FailureLimits::default()).new_session();
        assert!(matches!(
            auth.access(
                &headers(&[(header::AUTHORIZATION, "Bearer the-token".into())]),
                None
            ),
            Ok(Some(Access::Bearer))
        ));
        assert!(matches!(
            auth.access(
                &headers(&[(header::COOKIE, format!("tickmark_session={session}"))]),
                None
            ),
            Ok(Some(Access::Session { .. }))
        ));
        for refused in [
            headers(&[(header::AUTHORIZATION, "Bearer wrong".into())]),
            headers(&[(header::COOKIE, format!("tickmark_session={other}"))]),
            headers(&[(header::COOKIE, "tickmark_session=the-token".into())]),
            HeaderMap::new(),
        ] {
            assert!(
                matches!(auth.access(&refused, None), Ok(None)),
                "{refused:?}"
            );
        }
    }

    #[test]
    fn wrong_tokens_lock_every_token_check_but_not_sessions() {
        let auth = Auth::new(
            "the-token",
            FailureLimits {
                per_client: 3,
                ..FailureLimits::default()
            },
        );
        let me = Some(Client::of([192, 0, 2, 1].into()));
        let other = Some(Client::of([192, 0, 2, 2].into()));
        let session = auth.new_session();
        let cookie = headers(&[(header::COOKIE, format!("tickmark_session={session}"))]);
        let wrong_bearer = headers(&[(header::AUTHORIZATION, "Bearer wrong".into())]);
        let right_bearer = headers(&[(header::AUTHORIZATION, "Bearer the-token".into())]);

        assert_eq!(auth.sign_in(me, "wrong"), Ok(false));
        assert!(matches!(auth.access(&wrong_bearer, me), Ok(None)));
        assert_eq!(
            allowed(auth.authorize_action(&HeaderMap::new(), me, "wrong", "")),
            Err(Refusal::NoCredentials)
        );
        // Three wrong tokens, three ways: the right one is not checked now.
        assert!(auth.sign_in(me, "the-token").is_err());
        assert!(auth.access(&right_bearer, me).is_err());
        assert!(matches!(
            auth.authorize_action(&HeaderMap::new(), me, "the-token", ""),
            Err(Refusal::Locked(_))
        ));
        // Not checking a session cookie reveals nothing: it still works,
        // and another address is not locked.
        assert!(matches!(
            auth.access(&cookie, me),
            Ok(Some(Access::Session { .. }))
        ));
        assert_eq!(auth.sign_in(other, "the-token"), Ok(true));
        // Nor is a check without a token presented counted.
        for _ in 0..10 {
            assert!(matches!(auth.access(&HeaderMap::new(), other), Ok(None)));
            assert_eq!(
                allowed(auth.authorize_action(&HeaderMap::new(), other, "", "")),
                Err(Refusal::NoCredentials)
            );
        }
        assert!(matches!(
            auth.access(&right_bearer, other),
            Ok(Some(Access::Bearer))
        ));
    }

    #[test]
    fn revoked_sessions_read_nothing() {
        let auth = Auth::new("the-token", FailureLimits::default());
        let session = auth.new_session();
        let cookie = headers(&[(header::COOKIE, format!("tickmark_session={session}"))]);
        assert!(matches!(auth.access(&cookie, None), Ok(Some(_))));
        auth.revoke_sessions();
        assert!(matches!(auth.access(&cookie, None), Ok(None)));
    }
}
