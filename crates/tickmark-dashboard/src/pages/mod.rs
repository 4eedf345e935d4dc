//! The pages, one per file, and the bits of markup they share.

pub(crate) mod event;
pub(crate) mod events;
pub(crate) mod overview;

use maud::{html, Markup};

/// A state as a coloured badge (`class="state s-dead"`). The state names
/// are the engine's own words, escaped all the same.
fn badge(state: &str) -> Markup {
    html! { span class={ "state s-" (state) } { (state) } }
}

/// At most `max` characters of `text`, with `…` when cut (never splits a
/// character).
fn clip(text: &str, max: usize) -> String {
    let mut chars = text.chars();
    let mut out: String = chars.by_ref().take(max).collect();
    if chars.next().is_some() {
        out.push('…');
    }
    out
}

/// `<option>`s for a `<select>`, with `selected` on the current value.
fn options<'a>(values: impl IntoIterator<Item = (&'a str, &'a str)>, current: &str) -> Markup {
    html! {
        @for (value, label) in values {
            option value=(value) selected[value == current] { (label) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clipping_counts_characters_not_bytes() {
        assert_eq!(clip("héllo", 10), "héllo");
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("", 2), "");
    }

    #[test]
    fn badges_and_options_escape_their_text() {
        assert_eq!(
            badge("<x>").into_string(),
            "<span class=\"state s-&lt;x&gt;\">&lt;x&gt;</span>"
        );
        assert_eq!(
            options([("a\"", "<b>")], "a\"").into_string(),
            "<option value=\"a&quot;\" selected>&lt;b&gt;</option>"
        );
    }
}
