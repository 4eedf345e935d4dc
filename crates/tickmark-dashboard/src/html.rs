//! The page frame, and how times and durations read on the pages.
//!
//! Everything the dashboard shows from the database is attacker-influenced:
//! payloads, event ids, kinds, sources, step outputs and errors all arrive in
//! webhook bodies. The pages are `maud` templates, compiled with the crate:
//! every value spliced into one, in element content or an attribute, is
//! HTML-escaped by the template engine unless it is wrapped in `PreEscaped`,
//! which only the inline stylesheet and the doctype are. The page's `Content-Security-Policy`
//! forbids scripts as a second line of defence, not as a replacement.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped};

use super::viewer::Viewer;

/// A time as the dashboard shows it: UTC, to the second.
pub fn time(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// An optional time, or an empty cell.
pub fn maybe_time(at: Option<&DateTime<Utc>>) -> String {
    at.map(time).unwrap_or_default()
}

/// A duration in the largest sensible unit: `850ms`, `12.3s`, `4m05s`, `3h12m`, `2d04h`.
///
/// Hand-written: `humantime` prints every unit down to the nanosecond
/// (`4m 5s 12ms 345us`), too much for a table cell.
pub fn duration(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    if ms < 1_000 {
        format!("{ms}ms")
    } else if s < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 3_600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else if s < 86_400 {
        format!("{}h{:02}m", s / 3_600, s % 3_600 / 60)
    } else {
        format!("{}d{:02}h", s / 86_400, s % 86_400 / 3_600)
    }
}

/// How long from `from` to `to` (zero if `to` is earlier).
pub fn between(from: &DateTime<Utc>, to: &DateTime<Utc>) -> String {
    duration((*to - *from).to_std().unwrap_or_default())
}

/// What the frame around a page needs from the request: where the
/// dashboard is mounted (for the navigation) and, for a signed-in browser,
/// the CSRF token of the sign-out button.
#[derive(Debug, Clone, Default)]
pub struct Chrome {
    /// The dashboard's path prefix (where it is nested).
    pub base: String,
    /// The session's CSRF token, when the request came with the session cookie.
    pub csrf: Option<String>,
}

impl From<&Viewer> for Chrome {
    fn from(viewer: &Viewer) -> Self {
        Self {
            base: viewer.base.0.clone(),
            csrf: viewer.access.csrf().map(str::to_owned),
        }
    }
}

/// A finished page: status, title, body. Rendered with the frame (header,
/// navigation, inline CSS) and headers that keep the page private and
/// script-free.
#[derive(Debug)]
pub struct Page {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `<title>`.
    pub title: String,
    /// The frame's request-dependent parts.
    pub chrome: Chrome,
    /// The body, from a template.
    pub body: Markup,
}

impl Page {
    /// A 200 page.
    pub fn ok(chrome: impl Into<Chrome>, title: impl Into<String>, body: Markup) -> Self {
        Self {
            status: StatusCode::OK,
            title: title.into(),
            chrome: chrome.into(),
            body,
        }
    }

    /// A page that only says what went wrong.
    pub fn message(
        chrome: impl Into<Chrome>,
        status: StatusCode,
        title: &str,
        message: &str,
    ) -> Self {
        let chrome = chrome.into();
        let body = html! {
            h1 { (title) }
            p.notice.bad { (message) }
            p { a href={ (chrome.base) "/" } { "Back to the overview" } }
        };
        Self {
            status,
            title: title.to_owned(),
            chrome,
            body,
        }
    }

    /// The whole document.
    fn document(&self) -> Markup {
        let base = &self.chrome.base;
        html! {
            // `maud::DOCTYPE` is the same in capitals; the pages have always
            // started in lower case.
            (PreEscaped("<!doctype html>\n"))
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (self.title) " · tickmark" }
                    style { (PreEscaped(STYLE)) }
                }
                body {
                    header {
                        a.brand href={ (base) "/" } { "✓ tickmark" }
                        nav {
                            a href={ (base) "/" } { "Overview" }
                            a href={ (base) "/events" } { "Events" }
                            a href={ (base) "/events?state=dead" } { "Dead letters" }
                        }
                        @if let Some(csrf) = &self.chrome.csrf {
                            form.signout method="post" action={ (base) "/logout" } {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                    main { (self.body) }
                }
            }
        }
    }
}

/// The dashboard's security headers: no scripts, no framing, no caching,
/// no referrer (URLs carry event ids).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let html = self.document().into_string();
        let mut response = (self.status, html).into_response();
        let headers = response.headers_mut();
        for (name, value) in [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        response
    }
}

/// The CSS, inline: no external assets, no build step.
const STYLE: &str = include_str!("style.css");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spliced_text_is_escaped_in_content_and_attributes() {
        let hostile = r#"<script>alert("x" + 'y')</script> & "><img src=x>"#;
        let markup = html! { p title=(hostile) { (hostile) } }.into_string();
        assert!(!markup.contains("<script"), "{markup}");
        assert!(!markup.contains("<img"), "{markup}");
        assert!(!markup.contains(r#""><"#), "{markup}");
        assert!(markup.contains("&lt;script&gt;alert(&quot;x&quot; + 'y')&lt;/script&gt; &amp;"));
    }

    #[test]
    fn a_message_page_escapes_its_title_and_message() {
        let page = Page::message(
            Chrome {
                base: "/o\"ps".into(),
                csrf: Some("c\"srf".into()),
            },
            StatusCode::BAD_REQUEST,
            "<b>title</b>",
            "<i>why</i>",
        );
        let html = page.document().into_string();
        assert!(html.contains("&lt;b&gt;title&lt;/b&gt;"), "{html}");
        assert!(html.contains("&lt;i&gt;why&lt;/i&gt;"), "{html}");
        assert!(html.contains("href=\"/o&quot;ps/\""), "{html}");
        assert!(html.contains("value=\"c&quot;srf\""), "{html}");
        assert!(!html.contains("<b>") && !html.contains("<i>"), "{html}");
    }

    #[test]
    fn durations_pick_a_readable_unit() {
        use std::time::Duration;
        assert_eq!(duration(Duration::from_millis(850)), "850ms");
        assert_eq!(duration(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(duration(Duration::from_secs(245)), "4m05s");
        assert_eq!(duration(Duration::from_secs(3 * 3600 + 12 * 60)), "3h12m");
        assert_eq!(
            duration(Duration::from_secs(2 * 86_400 + 4 * 3600)),
            "2d04h"
        );
    }
}
