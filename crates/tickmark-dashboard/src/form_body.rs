//! A form body that could not be read: never an empty form.
//!
//! The login and retry forms are read whole before their credentials are
//! checked. A body that does not arrive (a body deadline such as
//! tower-http's `RequestBodyDeadlineLayer` ran out, the connection broke) or
//! is over the form limit is answered at once: 408 for a deadline, 413 over
//! the limit, 400 otherwise. Nothing is checked and nothing counts against
//! the throttle: a slow network is not a wrong token.

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::html::{Chrome, Page};
use super::links::Base;

/// The answer to a form whose body could not be read.
pub(crate) fn unreadable(base: &Base, rejection: &BytesRejection) -> Response {
    let chrome = Chrome {
        base: base.0.clone(),
        csrf: None,
    };
    let (status, message) = if is_timeout(rejection) {
        (
            StatusCode::REQUEST_TIMEOUT,
            "The form did not arrive in time. Nothing was checked or changed; send it again.",
        )
    } else {
        (
            rejection.status(),
            "The form could not be read (too large, or cut off). Nothing was checked or changed.",
        )
    };
    tracing::debug!(%rejection, %status, "dashboard: form body not read");
    Page::message(chrome, status, "Bad form", message).into_response()
}

/// Whether the body deadline ran out while the body was read.
fn is_timeout(rejection: &BytesRejection) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(rejection);
    while let Some(error) = cause {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = error.source();
    }
    false
}
