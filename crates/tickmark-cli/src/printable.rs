//! Text from outside, made safe to print on an operator's terminal.
//!
//! Much of what the CLI prints came from elsewhere: errors and progress
//! messages written by steps, payload-derived ids and kinds, audit notes.
//! An escape sequence in any of them (`ESC [ 2 J`, a fake prompt, an OSC 52
//! clipboard write, a hyperlink) would be acted on by the terminal. So every
//! control character (C0, DEL, C1) and every bidirectional-override
//! character is replaced before it is printed: C0 controls by their visible
//! Unicode "control picture" (`ESC` → `␛`), the others by `�`. Within a
//! table cell or a paragraph line breaks become `⏎` and tabs a space, so a
//! value cannot forge lines of output either.
//!
//! Human output passes through [`block`] once more as a whole before it is
//! written (`Output::emit`), so a value that a command forgot to clean
//! still reaches the terminal inert. `--json` needs none of this: JSON
//! escapes control characters itself.

/// `text` on one line, with every control and bidi-override character
/// replaced: for table cells and values inside a sentence.
pub(crate) fn line(text: &str) -> String {
    let text = text.trim_end();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => out.push('⏎'),
            '\t' => out.push(' '),
            c => push_visible(&mut out, c),
        }
    }
    out
}

/// `text` with its line breaks kept and every other control and
/// bidi-override character replaced: for whole outputs.
pub(crate) fn block(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push('\n'),
            c => push_visible(&mut out, c),
        }
    }
    out
}

/// `c`, or what stands for it when a terminal would act on it.
fn push_visible(out: &mut String, c: char) {
    match c {
        // C0 controls and DEL have pictures: U+2400 + code, U+2421.
        '\u{0}'..='\u{1f}' => out.push(char::from_u32(0x2400 + u32::from(c)).unwrap_or('\u{fffd}')),
        '\u{7f}' => out.push('\u{2421}'),
        c if c.is_control() || is_bidi_control(c) => out.push('\u{fffd}'),
        c => out.push(c),
    }
}

/// Characters that reorder how the rest of a line is displayed.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every character that must never reach a terminal raw.
    fn dangerous() -> impl Iterator<Item = char> {
        (0u32..0x20)
            .chain(0x7f..0xa0)
            .chain([0x61c, 0x200e, 0x200f, 0x202a, 0x202e, 0x2066, 0x2069])
            .filter_map(char::from_u32)
    }

    #[test]
    fn escape_sequences_become_visible_and_inert() {
        assert_eq!(line("\u{1b}[2Jgone"), "␛[2Jgone");
        assert_eq!(
            line("\u{1b}]52;c;aGk=\u{7}x"),
            "␛]52;c;aGk=␇x",
            "an OSC clipboard write"
        );
        assert_eq!(line("a\u{9b}31mb"), "a\u{fffd}31mb", "a C1 CSI");
        assert_eq!(line("evil\u{202e}txt.exe"), "evil\u{fffd}txt.exe");
        assert_eq!(line("del\u{7f}"), "del␡");
    }

    #[test]
    fn a_line_stays_one_line_and_a_block_keeps_its_lines() {
        assert_eq!(line("two\r\nlines\rand\ttab\n"), "two⏎lines⏎and tab");
        assert_eq!(block("a\nb\u{1b}c\td\n"), "a\nb␛c␉d\n");
        assert_eq!(line("café ✓ 日本"), "café ✓ 日本");
    }

    #[test]
    fn no_control_character_survives() {
        let all: String = dangerous().collect();
        for cleaned in [line(&format!("x{all}x")), block(&format!("x{all}x"))] {
            assert!(
                !cleaned
                    .chars()
                    .any(|c| dangerous().any(|d| d == c && d != '\n')),
                "{cleaned:?}"
            );
        }
    }
}
