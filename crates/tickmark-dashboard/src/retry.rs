//! `POST /events/{seq}/retry`: the retry button.
//!
//! The credentials are checked first, before anything is read or changed:
//! a request without the token (as `Authorization: Bearer …` or the form's
//! `token` field) or a signed-in browser's session with its CSRF token (the
//! form's hidden `csrf` field) is answered 401 (403 for a session whose CSRF
//! token is missing or wrong) and changes nothing. A re-queued event redirects
//! (303) to its page, where the audit trail shows the retry; a refused one
//! shows the event page with the store's reason.
//!
//! A wrong token (form field or bearer header) counts against the client's
//! address in the throttle; over budget, the request is answered 429 and its
//! token is not checked. A form whose body cannot be read is answered 408
//! or 400 and counts nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::{
    no_token_configured, too_many_wrong_tokens, unauthorized, Access, Client, Peer, Refusal,
};
use super::form_body;
use super::html::Page;
use super::links::Base;
use super::pages::event::{no_such_event, render, Notice};
use super::viewer::Viewer;
use super::{store_failure, Shared};
use tickmark_core::operator::{Actor, AdminError, Operations, RetryRequest};

/// The retry form's fields.
#[derive(Debug, Default, PartialEq)]
struct RetryForm {
    token: String,
    csrf: String,
    from_step: String,
    force: bool,
    reason: String,
}

impl RetryForm {
    fn parse(body: &[u8]) -> Self {
        let mut form = RetryForm::default();
        for (key, value) in form_urlencoded::parse(body) {
            match key.as_ref() {
                "token" => form.token = value.into_owned(),
                "csrf" => form.csrf = value.into_owned(),
                "from_step" => form.from_step = value.trim().to_owned(),
                "force" => form.force = matches!(value.as_ref(), "1" | "on" | "true" | "yes"),
                "reason" => form.reason = value.trim().to_owned(),
                _ => {}
            }
        }
        form
    }
}

pub(crate) async fn retry(
    State(shared): State<Arc<Shared>>,
    base: Base,
    seq: Result<Path<i64>, PathRejection>,
    Peer(client): Peer,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return form_body::unreadable(&base, &rejection),
    };
    let form = RetryForm::parse(&body);
    let viewer = match authorize(&shared, base, client, &headers, &form) {
        Ok(viewer) => viewer,
        Err(refusal) => return *refusal,
    };
    let base = &viewer.base;
    let Ok(Path(seq)) = seq else {
        return no_such_event(&viewer).into_response();
    };

    let request = RetryRequest {
        event_seq: seq,
        from_step: (!form.from_step.is_empty()).then_some(form.from_step.as_str()),
        force: form.force,
        actor: Actor {
            who: &shared.actor,
            reason: (!form.reason.is_empty()).then_some(form.reason.as_str()),
        },
    };
    match shared.engine.store().event_retry(&request).await {
        Ok(record) => {
            tracing::info!(
                event_seq = seq,
                state = %record.state,
                from_step = request.from_step,
                actor = %shared.actor,
                "dashboard: event re-queued"
            );
            see_other(&base.event(seq))
        }
        Err(AdminError::NotFound(_)) => no_such_event(&viewer).into_response(),
        Err(AdminError::Store(error)) => store_failure(&viewer, &error).into_response(),
        Err(AdminError::Refused(reason)) => {
            refused(&shared, &viewer, seq, StatusCode::CONFLICT, &reason).await
        }
        Err(unknown @ AdminError::UnknownStep { .. }) => {
            refused(
                &shared,
                &viewer,
                seq,
                StatusCode::BAD_REQUEST,
                &unknown.to_string(),
            )
            .await
        }
        // `AdminError` is non-exhaustive (a new reason is no breaking
        // change for users): a reason this page does not know yet is
        // shown as a refusal, in the error's own words.
        Err(other) => {
            refused(
                &shared,
                &viewer,
                seq,
                StatusCode::CONFLICT,
                &other.to_string(),
            )
            .await
        }
    }
}

/// Who is acting, when the request may act: the bearer token, the form's
/// `token`, or a session with its CSRF token. Otherwise the refusal (401,
/// or 403 for a session without its CSRF token, or 429 after too many wrong
/// tokens from `client`), before anything is read.
fn authorize(
    shared: &Shared,
    base: Base,
    client: Option<Client>,
    headers: &HeaderMap,
    form: &RetryForm,
) -> Result<Viewer, Box<Response>> {
    let Some(auth) = &shared.auth else {
        return Err(Box::new(no_token_configured(&base, "Retry is off")));
    };
    match auth.authorize_action(headers, client, &form.token, &form.csrf) {
        Ok(access) => Ok(Viewer { base, access }),
        Err(Refusal::Locked(locked)) => Err(Box::new(too_many_wrong_tokens(&base, locked))),
        Err(Refusal::NoCredentials) => {
            tracing::warn!("dashboard: retry refused, missing or wrong token");
            Err(Box::new(unauthorized(
                &base,
                "The token is missing or wrong. Nothing was changed.",
            )))
        }
        Err(Refusal::BadCsrf) => {
            tracing::warn!("dashboard: retry refused, the form's CSRF token is missing or wrong");
            Err(Box::new(
                Page::message(
                &viewer(&base),
                StatusCode::FORBIDDEN,
                "Form check failed",
                "This form did not come from this dashboard's page (or the page is out of date): \
                 reload the event page and try again. Nothing was changed.",
            )
            .into_response(),
            ))
        }
    }
}

/// The event page with why the retry was not done.
async fn refused(
    shared: &Shared,
    viewer: &Viewer,
    seq: i64,
    status: StatusCode,
    reason: &str,
) -> Response {
    tracing::info!(event_seq = seq, reason, "dashboard: retry refused");
    let notice = Notice {
        status,
        message: format!("Not retried: {reason}"),
    };
    render(shared, viewer, seq, Some(notice))
        .await
        .into_response()
}

/// An anonymous viewer at `base`, for the pages shown before the
/// credentials are known.
fn viewer(base: &Base) -> Viewer {
    Viewer {
        base: base.clone(),
        access: Access::Anonymous,
    }
}

/// 303 See Other to `location` (a path built by [`Base`]).
fn see_other(location: &str) -> Response {
    match HeaderValue::from_str(location) {
        Ok(value) => (StatusCode::SEE_OTHER, [(header::LOCATION, value)]).into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_form_is_read_leniently_but_exactly() {
        let form = RetryForm::parse(
            b"token=a%2Bb+c&csrf=ab&from_step=+send+&force=on&reason=fixed&extra=1",
        );
        assert_eq!(
            form,
            RetryForm {
                token: "a+b c".into(),
                csrf: "ab".into(),
                from_step: "send".into(),
                force: true,
                reason: "fixed".into(),
            }
        );
        assert_eq!(RetryForm::parse(b""), RetryForm::default());
        assert!(!RetryForm::parse(b"force=0").force);
    }
}
