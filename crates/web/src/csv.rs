//! CSV downloads: every CSV the API (`format=csv`) and the pages (`?csv=<table>`) send is
//! written here, so that every cell is encoded, and defused for spreadsheets, the same way.
//!
//! A cell that starts with `=`, `+`, `-`, `@`, tab or carriage return is run as a formula by
//! spreadsheet programs. As OWASP's CSV-injection guidance says, such a cell is written with a
//! single quote in front and always quoted (`"'=HYPERLINK(…)"`), so it opens as the text that
//! was pushed. A cell that is a number as shown (`-12`, `-4.5e3`, `-$1,234.50`, `-3.5 %`) is left
//! alone: a spreadsheet reads it as a number, never as a formula.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// A CSV document being written, sent as the attachment `<name>.csv`.
pub(crate) struct Csv {
    name: String,
    out: String,
}

impl Csv {
    pub fn new<S: AsRef<str>>(name: &str, header: impl IntoIterator<Item = S>) -> Csv {
        let mut csv = Csv {
            name: name.to_string(),
            out: String::new(),
        };
        csv.row(header);
        csv
    }

    /// Append one record.
    pub fn row<S: AsRef<str>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let start = self.out.len();
        for (i, cell) in cells.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            push_cell(&mut self.out, cell.as_ref());
        }
        // A record of one empty cell would read as a blank line.
        if self.out.len() == start {
            self.out.push_str("\"\"");
        }
        self.out.push('\n');
    }

    pub fn into_response(self) -> Response {
        (
            [
                (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{}.csv\"", self.name),
                ),
            ],
            self.out,
        )
            .into_response()
    }
}

/// Write one cell: quoted when it holds a delimiter, a quote or a line break (RFC 4180), and
/// prefixed with `'` (and quoted) when a spreadsheet would run it as a formula.
fn push_cell(out: &mut String, cell: &str) {
    let defuse = runs_as_formula(cell);
    if !defuse && !cell.contains([',', '"', '\n', '\r']) {
        out.push_str(cell);
        return;
    }
    out.push('"');
    if defuse {
        out.push('\'');
    }
    out.push_str(&cell.replace('"', "\"\""));
    out.push('"');
}

/// Whether a spreadsheet would treat `cell` as a formula.
fn runs_as_formula(cell: &str) -> bool {
    cell.starts_with(['=', '+', '-', '@', '\t', '\r']) && !is_shown_number(cell)
}

/// `-12`, `+3.5`, `-4.5e3`, `-$1,234.50`, `-3.5 %`: a sign, then digits as the pages show
/// numbers. Nothing else (no letters, no operators), so none of these is a formula.
fn is_shown_number(cell: &str) -> bool {
    let s = cell.strip_prefix(['+', '-']).unwrap_or(cell);
    let s = s.strip_prefix('$').unwrap_or(s);
    let s = s
        .strip_suffix(" %")
        .or_else(|| s.strip_suffix('%'))
        .unwrap_or(s);
    let (mantissa, exponent) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (s, None),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, "0"));
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    digits(&int.replace(',', ""))
        && !int.starts_with(',')
        && digits(frac)
        && exponent.is_none_or(digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(cells: &[&str]) -> String {
        let mut csv = Csv {
            name: String::new(),
            out: String::new(),
        };
        csv.row(cells);
        csv.out
    }

    #[test]
    fn formula_cells_are_prefixed_and_quoted() {
        assert_eq!(
            line(&["=1+1", "+x", "-2+3", "@SUM(A1)", "\tx", "\rx"]),
            "\"'=1+1\",\"'+x\",\"'-2+3\",\"'@SUM(A1)\",\"'\tx\",\"'\rx\"\n"
        );
        assert_eq!(
            line(&[r#"=HYPERLINK("http://e/","x")"#]),
            "\"'=HYPERLINK(\"\"http://e/\"\",\"\"x\"\")\"\n"
        );
    }

    #[test]
    fn numbers_stay_numbers_and_plain_text_stays_plain() {
        assert_eq!(
            line(&[
                "-12",
                "-4.5",
                "+3",
                "-1e-3",
                "-$1,234.50",
                "-3.5 %",
                "unknown",
                "a,b",
                ""
            ]),
            "-12,-4.5,+3,-1e-3,\"-$1,234.50\",-3.5 %,unknown,\"a,b\",\n"
        );
        for not_a_number in [
            "-", "-$", "-1-1", "-1e", "-,5", "-inf", "-NaN", "-1.", "- 5",
        ] {
            assert!(runs_as_formula(not_a_number), "{not_a_number}");
        }
        assert_eq!(line(&[""]), "\"\"\n");
    }
}
