//! A small plain-text table: a header row, columns padded to their widest
//! cell, two spaces between columns, numbers right-aligned. Cells are one
//! line each (line breaks become `⏎`); width counts characters.

/// Rows under a header, rendered as aligned text.
#[derive(Debug)]
pub(crate) struct Table {
    headers: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub(crate) fn new<const N: usize>(headers: [&str; N]) -> Self {
        Self {
            headers: headers.iter().map(|h| (*h).to_owned()).collect(),
            right: vec![false; N],
            rows: Vec::new(),
        }
    }

    /// Right-align these columns (counts, durations).
    pub(crate) fn right_aligned(mut self, columns: &[usize]) -> Self {
        for column in columns {
            if let Some(right) = self.right.get_mut(*column) {
                *right = true;
            }
        }
        self
    }

    /// Add a row; missing cells are blank, extra cells are dropped.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        let mut cells: Vec<String> = cells.into_iter().map(|cell| one_line(&cell)).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in a newline.
    pub(crate) fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate() {
                widths[column] = widths[column].max(width(cell));
            }
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (column, cell) in row.iter().enumerate() {
                if column > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[column] - width(cell));
                if self.right[column] {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

fn width(text: &str) -> usize {
    text.chars().count()
}

fn one_line(text: &str) -> String {
    text.trim_end()
        .replace("\r\n", "⏎")
        .replace(['\n', '\r'], "⏎")
        .replace('\t', " ")
}

/// `text` cut to `max` characters, ending in `…` when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
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
    fn truncation_marks_the_cut() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(truncate("ééééé", 3), "éé…");
    }
}
