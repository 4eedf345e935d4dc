//! Signing in and out in a browser.
//!
//! | route | what it does |
//! |---|---|
//! | `GET /login` | the form: one password field for the token (also the body of every 401 a page answers) |
//! | `POST /login` | fields `token`, `next`: the right token sets the session cookie and redirects (303) to `next`, a page of this dashboard; a wrong one is a 401 with the form again |
//! | `POST /logout` | field `csrf`: clears the cookie and revokes every session issued so far (every browser is signed out), 303 to the form |
//!
//! A wrong token counts against the client's address in the throttle; over
//! budget, the form is answered 429 without the token being checked. A form
//! whose body cannot be read is answered 408 or 400 and counts nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;

use super::auth::{
    challenge, clear_cookie, no_token_configured, set_cookie, too_many_wrong_tokens, unauthorized,
    Access, Peer, Refusal,
};
use super::form_body;
use super::html::{Chrome, Page};
use super::links::Base;
use super::viewer::Viewer;
use super::Shared;

/// The login form, answering with `status`; `next` is where to go after.
pub(crate) fn page(base: &Base, next: &str, status: StatusCode, problem: Option<&str>) -> Page {
    let body = html! {
        h1 { "Sign in" }
        @if let Some(problem) = problem {
            p.notice.bad #notice { (problem) }
        }
        p.muted {
            "This dashboard shows webhook payloads, so it needs its token (the one it was started with). "
            "Signing in keeps a session cookie in this browser for 12 hours, or until you sign out."
        }
        form.login method="post" action={ (base.0) "/login" } {
            input type="hidden" name="next" value=(safe_next(base, next));
            label {
                "token"
                input type="password" name="token" autocomplete="current-password" required autofocus;
            }
            button type="submit" { "Sign in" }
        }
        p.muted {
            "Scripts and Prometheus send " code { "Authorization: Bearer <token>" } " instead."
        }
    };
    Page {
        status,
        title: "Sign in".to_owned(),
        chrome: Chrome {
            base: base.0.clone(),
            csrf: None,
        },
        body,
    }
}

/// `GET /login`: the form, or straight on when already signed in.
pub(crate) async fn show(viewer: Viewer, RawQuery(raw): RawQuery) -> Response {
    let next = field(raw.as_deref().unwrap_or("").as_bytes(), "next");
    match viewer.access {
        Access::Anonymous => page(&viewer.base, &next, StatusCode::OK, None).into_response(),
        Access::Bearer | Access::Session { .. } => see_other(&safe_next(&viewer.base, &next), None),
    }
}

/// `POST /login`.
pub(crate) async fn sign_in(
    State(shared): State<Arc<Shared>>,
    base: Base,
    Peer(client): Peer,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(auth) = &shared.auth else {
        return no_token_configured(&base, "Signing in is off");
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return form_body::unreadable(&base, &rejection),
    };
    let next = field(&body, "next");
    match auth.sign_in(client, &field(&body, "token")) {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!("dashboard: sign-in refused, wrong token");
            return challenge(page(
                &base,
                &next,
                StatusCode::UNAUTHORIZED,
                Some("That is not the dashboard's token."),
            ));
        }
        Err(locked) => return too_many_wrong_tokens(&base, locked),
    }
    tracing::info!("dashboard: signed in");
    let cookie = set_cookie(&auth.new_session(), cookie_path(&base));
    see_other(&safe_next(&base, &next), cookie)
}

/// `POST /logout`: needs the session's CSRF token, like every form that
/// changes something. Revokes every session issued so far, so a copy of
/// the cookie (stolen, or left in another browser) is refused from now on:
/// signing out signs every browser out.
pub(crate) async fn sign_out(
    State(shared): State<Arc<Shared>>,
    base: Base,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let Some(auth) = &shared.auth else {
        return no_token_configured(&base, "Signing out is off");
    };
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return form_body::unreadable(&base, &rejection),
    };
    match auth.authorize_action(&headers, client, "", &field(&body, "csrf")) {
        Ok(_) => {}
        Err(Refusal::Locked(locked)) => return too_many_wrong_tokens(&base, locked),
        Err(Refusal::NoCredentials | Refusal::BadCsrf) => {
            return unauthorized(&base, "Not signed out: the form's session check failed.")
        }
    }
    auth.revoke_sessions();
    tracing::info!("dashboard: signed out; every session issued so far is revoked");
    see_other(
        &format!("{}/login", base.0),
        clear_cookie(cookie_path(&base)),
    )
}

/// The last value of `name` in a form body or query.
fn field(form: &[u8], name: &str) -> String {
    form_urlencoded::parse(form)
        .filter(|(key, _)| key == name)
        .last()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

/// Where the cookie applies: the dashboard's prefix (`/` at the root).
fn cookie_path(base: &Base) -> &str {
    if base.0.is_empty() {
        "/"
    } else {
        &base.0
    }
}

/// `next` when it is a page of this dashboard; otherwise its overview. A
/// login link cannot send the browser to another site (no open redirect).
fn safe_next(base: &Base, next: &str) -> String {
    let inside = next == base.0
        || next
            .strip_prefix(base.0.as_str())
            .is_some_and(|rest| rest.starts_with('/'));
    let plain_path = next.starts_with('/')
        && !next.starts_with("//")
        && !next.contains('\\')
        && !next.chars().any(char::is_control)
        && !next.ends_with("/login");
    if inside && plain_path {
        next.to_owned()
    } else {
        format!("{}/", base.0)
    }
}

/// 303 See Other to `location`, with a cookie to set.
fn see_other(location: &str, cookie: Option<HeaderValue>) -> Response {
    let Ok(location) = HeaderValue::from_str(location) else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response();
    if let Some(cookie) = cookie {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_stays_inside_the_dashboard() {
        let root = Base(String::new());
        let ops = Base("/ops".into());
        assert_eq!(safe_next(&root, "/events/3?x=1"), "/events/3?x=1");
        assert_eq!(safe_next(&ops, "/ops/events"), "/ops/events");
        assert_eq!(safe_next(&ops, "/ops"), "/ops");
        for outside in [
            "",
            "https://evil.example/",
            "//evil.example/",
            "/\\evil.example",
            "events",
            "/opsx/events",
            "/elsewhere",
            "/ops/login",
            "/ops/a\nb",
        ] {
            assert_eq!(safe_next(&ops, outside), "/ops/", "{outside:?}");
        }
        assert_eq!(safe_next(&root, "//evil.example"), "/");
    }

    #[test]
    fn the_login_form_posts_the_token_as_a_password() {
        let html = page(
            &Base("/ops".into()),
            "/ops/events/7",
            StatusCode::UNAUTHORIZED,
            None,
        )
        .body
        .into_string();
        assert!(html.contains("action=\"/ops/login\""), "{html}");
        assert!(html.contains("method=\"post\""), "{html}");
        assert!(html.contains("type=\"password\" name=\"token\""), "{html}");
        assert!(
            html.contains("name=\"next\" value=\"/ops/events/7\""),
            "{html}"
        );
    }
}
