//! Plain-text tables, laid out by `comfy-table`: a header row, columns
//! padded to their widest cell by display width (so `日本` counts two
//! columns and `é` one), two spaces between columns, numbers right-aligned,
//! no borders and no colour. Every cell is cleaned for the terminal
//! ([`printable::line`]): one line, no control characters.

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, ContentArrangement};
use unicode_width::UnicodeWidthChar;

use super::printable;

/// Rows, with or without a header, rendered as aligned text.
#[derive(Debug)]
pub(crate) struct Table {
    inner: comfy_table::Table,
    columns: usize,
}

impl Table {
    /// A table with these column headers.
    pub(crate) fn new<const N: usize>(headers: [&str; N]) -> Self {
        let mut table = Self::without_header(N);
        table.inner.set_header(headers.to_vec());
        table
    }

    /// A table of `columns` columns without a header line (a list of facts).
    pub(crate) fn without_header(columns: usize) -> Self {
        let mut inner = comfy_table::Table::new();
        inner
            .load_preset(NOTHING)
            .set_content_arrangement(ContentArrangement::Disabled);
        Self { inner, columns }
    }

    /// Right-align these columns (counts, durations).
    pub(crate) fn right_aligned(mut self, columns: &[usize]) -> Self {
        for column in columns {
            if let Some(column) = self.inner.column_mut(*column) {
                column.set_cell_alignment(CellAlignment::Right);
            }
        }
        self
    }

    /// Add a row; missing cells are blank, extra cells are dropped.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        let mut cells: Vec<String> = cells.iter().map(|cell| printable::line(cell)).collect();
        cells.resize(self.columns, String::new());
        self.inner.add_row(cells);
    }

    /// The table as text, one line per row, each ending in a newline.
    pub(crate) fn render(&mut self) -> String {
        // One space of padding either side of each cell makes two between
        // columns; none at the edges.
        let last = self.columns.saturating_sub(1);
        for (index, column) in self.inner.column_iter_mut().enumerate() {
            let left = u16::from(index > 0);
            let right = u16::from(index < last);
            column.set_padding((left, right));
        }
        let mut out = String::new();
        for line in self.inner.lines() {
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `text` cut to `max` display columns, ending in `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    let width = |c: char| c.width().unwrap_or(0);
    if text.chars().map(width).sum::<usize>() <= max {
        return text.to_owned();
    }
    let mut cut = String::new();
    let mut used = 0;
    for c in text.chars() {
        // Room is kept for the `…`.
        if used + width(c) + 1 > max {
            break;
        }
        used += width(c);
        cut.push(c);
    }
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_and_numbers_right_aligned() {
        let mut table = Table::new(["STATE", "SOURCE", "EVENTS"]).right_aligned(&[2]);
        table.row(vec!["pending".into(), "stripe".into(), "3".into()]);
        table.row(vec!["done".into(), "shopify".into(), "1200".into()]);
        assert_eq!(
            table.render(),
            "STATE    SOURCE   EVENTS\n\
             pending  stripe        3\n\
             done     shopify    1200\n"
        );
    }

    #[test]
    fn cells_stay_on_one_line_and_count_characters() {
        let mut table = Table::new(["A", "B"]);
        table.row(vec!["é→x".into(), "two\nlines".into()]);
        table.row(vec!["y".into()]);
        assert_eq!(table.render(), "A    B\né→x  two⏎lines\ny\n");
    }

    #[test]
    fn wide_characters_count_their_display_width() {
        let mut table = Table::new(["ID", "STATE"]);
        table.row(vec!["日本".into(), "done".into()]);
        table.row(vec!["abcde".into(), "dead".into()]);
        assert_eq!(table.render(), "ID     STATE\n日本   done\nabcde  dead\n");
    }

    #[test]
    fn a_fact_list_has_no_header_line() {
        let mut facts = Table::without_header(2);
        facts.row(vec!["state".into(), "dead".into()]);
        facts.row(vec!["last error".into(), "boom".into()]);
        assert_eq!(facts.render(), "state       dead\nlast error  boom\n");
    }

    #[test]
    fn cells_carry_no_escape_sequences() {
        let mut table = Table::new(["ERROR"]);
        table.row(vec!["\u{1b}[31mred\u{1b}[0m\u{7}".into()]);
        let text = table.render();
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(text.contains("␛[31mred␛[0m␇"), "{text}");
    }

    #[test]
    fn truncation_marks_the_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(truncate("ééééé", 3), "éé…");
        assert_eq!(truncate("日本語です", 5), "日本…");
    }
}
