//! Who is looking, and from where: what every page handler needs to render
//! its links and forms.

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::auth::Access;
use super::links::Base;

/// The dashboard's prefix and how the request authenticated (set by the
/// guard; [`Access::Anonymous`] on routes it lets through unchecked).
#[derive(Debug, Clone)]
pub struct Viewer {
    /// Where the dashboard is mounted.
    pub base: Base,
    /// How the request proved it holds the token.
    pub access: Access,
}

impl<S: Send + Sync> FromRequestParts<S> for Viewer {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let base = Base::from_request_parts(parts, state).await?;
        let access = parts
            .extensions
            .get::<Access>()
            .cloned()
            .unwrap_or(Access::Anonymous);
        Ok(Self { base, access })
    }
}
