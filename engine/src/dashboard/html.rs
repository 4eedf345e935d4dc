//! HTML escaping and the page frame.
//!
//! Everything the dashboard shows from the database is attacker-influenced:
//! payloads, event ids, kinds, sources, step outputs and errors all arrive in
//! webhook bodies. Every such value goes through [`escape`] (or its
//! `Display` form, [`Text`]) before it touches the page, in element content
//! and in double-quoted attributes alike. The page's `Content-Security-Policy`
//! forbids scripts as a second line of defence, not as a replacement.

use std::fmt::{self, Write as _};

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

/// `value` with `&`, `<`, `>`, `"` and `'` replaced by character references:
/// safe in element content and in quoted attribute values.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let _ = write!(out, "{}", Text(value));
    out
}

/// Displays its value escaped (see [`escape`]); for use in `format!`
/// without an intermediate `String`.
#[derive(Debug, Clone, Copy)]
pub struct Text<T>(pub T);

impl<T: fmt::Display> fmt::Display for Text<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Escaper<'a, 'b>(&'a mut fmt::Formatter<'b>);
        impl fmt::Write for Escaper<'_, '_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                let mut rest = s;
                while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
                    let (plain, tail) = rest.split_at(at);
                    self.0.write_str(plain)?;
                    let mut chars = tail.chars();
                    let reference = match chars.next() {
                        Some('&') => "&amp;",
                        Some('<') => "&lt;",
                        Some('>') => "&gt;",
                        Some('"') => "&quot;",
                        _ => "&#39;",
                    };
                    self.0.write_str(reference)?;
                    rest = chars.as_str();
                }
                self.0.write_str(rest)
            }
        }
        write!(Escaper(f), "{}", self.0)
    }
}

/// A time as the dashboard shows it: UTC, to the second.
pub fn time(at: &DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// An optional time, or an empty cell.
pub fn maybe_time(at: Option<&DateTime<Utc>>) -> String {
    at.map(time).unwrap_or_default()
}

/// A duration in the largest sensible unit: `850ms`, `12.3s`, `4m05s`, `3h12m`, `2d04h`.
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

/// A finished page: status, title, body. Rendered with the frame (header,
/// navigation, inline CSS) and headers that keep the page private and
/// script-free.
#[derive(Debug)]
pub struct Page {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `<title>` (escaped when rendered).
    pub title: String,
    /// The dashboard's path prefix (where it is nested), for the navigation.
    pub base: String,
    /// The body HTML: already escaped by the page that built it.
    pub body: String,
}

impl Page {
    /// A 200 page.
    pub fn ok(base: &str, title: impl Into<String>, body: String) -> Self {
        Self {
            status: StatusCode::OK,
            title: title.into(),
            base: base.to_owned(),
            body,
        }
    }

    /// A page that only says what went wrong.
    pub fn message(base: &str, status: StatusCode, title: &str, message: &str) -> Self {
        Self {
            status,
            title: title.to_owned(),
            base: base.to_owned(),
            body: format!(
                "<h1>{}</h1>\n<p class=\"notice bad\">{}</p>\n<p><a href=\"{}/\">Back to the overview</a></p>\n",
                Text(title),
                Text(message),
                Text(base)
            ),
        }
    }
}

/// The dashboard's security headers: no scripts, no framing, no caching,
/// no referrer (URLs carry event ids).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let html = format!(
            "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>{title} · tickmark</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
             <header><a class=\"brand\" href=\"{base}/\">✓ tickmark</a>\
             <nav><a href=\"{base}/\">Overview</a><a href=\"{base}/events\">Events</a>\
             <a href=\"{base}/events?state=dead\">Dead letters</a></nav></header>\n\
             <main>\n{body}</main>\n</body>\n</html>\n",
            title = Text(&self.title),
            base = Text(&self.base),
            body = self.body,
        );
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
const STYLE: &str = r#"
:root { --fg:#1f2328; --muted:#656d76; --line:#d0d7de; --bg:#ffffff; --head:#f6f8fa;
  --ok:#1a7f37; --ok-bg:#dafbe1; --run:#0969da; --run-bg:#ddf4ff; --warn:#9a6700; --warn-bg:#fff8c5;
  --bad:#cf222e; --bad-bg:#ffebe9; --park:#8250df; --park-bg:#fbefff; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: var(--bg);
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
header { display: flex; align-items: center; gap: 24px; padding: 10px 24px;
  background: #24292f; color: #fff; }
header a { color: #fff; text-decoration: none; }
header .brand { font-weight: 700; font-size: 16px; }
header nav a { margin-right: 16px; opacity: .85; }
header nav a:hover { opacity: 1; text-decoration: underline; }
main { padding: 16px 24px 40px; max-width: 1600px; }
h1 { font-size: 20px; margin: 8px 0 12px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
a { color: var(--run); }
code, pre, .mono, table.data td { font-family: "DejaVu Sans Mono", ui-monospace, Menlo, Consolas, monospace; font-size: 12.5px; }
table.data { border-collapse: collapse; width: 100%; }
table.data.compact { width: auto; min-width: 480px; }
table.data th, table.data td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
table.data th { background: var(--head); font-weight: 600; white-space: nowrap; }
table.data td.num, table.data th.num { text-align: right; }
table.data td.wrap { word-break: break-all; }
table.kv { border-collapse: collapse; }
table.kv th { text-align: left; padding: 2px 16px 2px 0; color: var(--muted); font-weight: 500; white-space: nowrap; vertical-align: top; }
table.kv td { padding: 2px 0; font-family: "DejaVu Sans Mono", ui-monospace, monospace; font-size: 12.5px; word-break: break-all; }
.state { display: inline-block; padding: 0 6px; border-radius: 4px; font-weight: 600;
  font-family: "DejaVu Sans Mono", ui-monospace, monospace; font-size: 12px; background: var(--head); color: var(--muted); }
.s-done { color: var(--ok); background: var(--ok-bg); }
.s-running { color: var(--run); background: var(--run-bg); }
.s-pending { color: var(--muted); background: var(--head); }
.s-retrying, .s-interrupted { color: var(--warn); background: var(--warn-bg); }
.s-dead { color: var(--bad); background: var(--bad-bg); }
.s-parked { color: var(--park); background: var(--park-bg); }
.s-snoozed { color: var(--run); background: var(--head); }
.s-skipped, .s-cancelled, .s-not_run, .s-ignored, .s-stale { color: var(--muted); background: var(--head); }
tr.fail > td { background: #fff5f5; }
tr.warn > td { background: #fffdf0; }
tr.detail > td { border-top: none; }
.error { color: var(--bad); white-space: pre-wrap; word-break: break-word; }
.muted { color: var(--muted); }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin-bottom: 8px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 130px; }
.card .label { color: var(--muted); font-size: 12px; }
.card .value { font-size: 22px; font-weight: 600; font-family: "DejaVu Sans Mono", ui-monospace, monospace; }
.card.bad { border-color: var(--bad); } .card.bad .value { color: var(--bad); }
.card.warn { border-color: #d4a72c; } .card.warn .value { color: var(--warn); }
.bars { display: flex; align-items: flex-end; gap: 2px; height: 60px; padding: 4px 0;
  border-bottom: 1px solid var(--line); max-width: 720px; }
.bars span { flex: 1; background: var(--ok); }
.notice { padding: 8px 12px; border-radius: 6px; border: 1px solid var(--line); }
.notice.bad { background: var(--bad-bg); border-color: var(--bad); color: var(--bad); }
.notice.ok { background: var(--ok-bg); border-color: var(--ok); color: var(--ok); }
form.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-end; margin-bottom: 12px; }
form label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); gap: 2px; }
input, select, button { font: inherit; padding: 4px 6px; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
input:not([type=checkbox]), select, button { height: 30px; }
button { background: #1f883d; color: #fff; border-color: #1a7f37; font-weight: 600; padding: 5px 12px; cursor: pointer; }
button.secondary { background: var(--head); color: var(--fg); border-color: var(--line); }
form.retry { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-end; padding: 12px;
  border: 1px solid var(--line); border-radius: 6px; background: var(--head); }
form.retry label.check { flex-direction: row; align-items: center; gap: 4px; height: 30px; color: var(--fg); font-size: 13px; }
pre.json { background: var(--head); border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px;
  overflow: auto; max-height: 420px; white-space: pre-wrap; word-break: break-all; margin: 4px 0; }
details summary { cursor: pointer; color: var(--muted); }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_markup_character_is_replaced() {
        assert_eq!(
            escape(r#"<script>alert("x" + 'y')</script> & more"#),
            "&lt;script&gt;alert(&quot;x&quot; + &#39;y&#39;)&lt;/script&gt; &amp; more"
        );
    }

    #[test]
    fn plain_text_and_non_ascii_pass_through() {
        assert_eq!(escape(""), "");
        assert_eq!(escape("evt_1NG8Du2e"), "evt_1NG8Du2e");
        assert_eq!(escape("café ✓ 日本"), "café ✓ 日本");
        assert_eq!(escape("a&<b"), "a&amp;&lt;b");
    }

    #[test]
    fn escaping_is_not_idempotent_so_nothing_is_escaped_twice_by_accident() {
        // A value that already looks escaped is shown as typed, not decoded.
        assert_eq!(escape("&lt;b&gt;"), "&amp;lt;b&amp;gt;");
    }

    #[test]
    fn the_display_form_escapes_any_display_value() {
        assert_eq!(
            format!("{}", Text("x\"><img src=x>")),
            "x&quot;&gt;&lt;img src=x&gt;"
        );
        let json = serde_json::json!({ "html": "<b>" });
        assert_eq!(
            format!("{}", Text(&json)),
            r#"{&quot;html&quot;:&quot;&lt;b&gt;&quot;}"#
        );
        assert_eq!(format!("{}", Text(42)), "42");
    }

    #[test]
    fn no_output_of_escape_contains_markup_characters() {
        for c in ['<', '>', '"', '\''] {
            let sample: String = std::iter::repeat_n(c, 3).chain("x".chars()).collect();
            assert!(!escape(&sample).contains(c), "{c}");
        }
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
