//! Markdown tables of medians and in-run ratios, as every benchmark prints them.

use std::fmt::Write as _;

/// A Markdown table: a header row, right-aligned columns after the first `left` ones.
#[derive(Debug, Clone, Default)]
pub struct Table {
    headers: Vec<String>,
    left: usize,
    text: Vec<usize>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers; the first `left` columns are text (left-aligned),
    /// the others numbers (right-aligned).
    #[must_use]
    pub fn new<S: AsRef<str>>(headers: &[S], left: usize) -> Self {
        Self {
            headers: headers.iter().map(|h| h.as_ref().to_owned()).collect(),
            left,
            text: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Makes these further columns text (left-aligned) too.
    #[must_use]
    pub fn text_columns(mut self, columns: &[usize]) -> Self {
        self.text.extend_from_slice(columns);
        self
    }

    /// Adds a row; missing cells are left empty, extra cells are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.headers.len(), String::new());
        self.rows.push(row);
    }

    /// The number of rows.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the table has no rows.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as Markdown, one line per row, ending with a newline.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line(&self.headers));
        let rule: Vec<String> = (0..self.headers.len())
            .map(|i| {
                if i < self.left || self.text.contains(&i) {
                    "---"
                } else {
                    "---:"
                }
                .to_owned()
            })
            .collect();
        out.push_str(&format!("|{}|\n", rule.join("|")));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// A figure with no decimals, or `failed` when absent.
#[must_use]
pub fn num(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.0}"),
        _ => "failed".to_owned(),
    }
}

/// `v / base` with two decimals (three below 0.1), or `n/a` when either is missing.
#[must_use]
pub fn ratio(v: Option<f64>, base: Option<f64>) -> String {
    match (v, base) {
        (Some(v), Some(b)) if b > 0.0 && v.is_finite() && b.is_finite() => {
            let r = v / b;
            if r < 0.1 {
                format!("{r:.3}")
            } else {
                format!("{r:.2}")
            }
        }
        _ => "n/a".to_owned(),
    }
}

/// A figure followed by its ratio in parentheses, `1204 (1.00)`.
#[must_use]
pub fn with_ratio(v: Option<f64>, base: Option<f64>) -> String {
    match v {
        Some(_) => format!("{} ({})", num(v), ratio(v, base)),
        None => "failed".to_owned(),
    }
}

/// Bytes as MiB with no decimals (`12 MiB`), or `n/a`.
#[must_use]
pub fn mib(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => {
            let mut s = String::new();
            let _ = write!(s, "{:.0} MiB", b as f64 / (1u64 << 20) as f64);
            s
        }
        None => "n/a".to_owned(),
    }
}

/// A byte size as RMM's benchmarks name it: `64 KiB`, `4 MiB`, `1 GiB`, or bytes.
#[must_use]
pub fn size_name(bytes: usize) -> String {
    const UNITS: [(usize, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    for (unit, name) in UNITS {
        if bytes >= unit && bytes % unit == 0 {
            return format!("{} {name}", bytes / unit);
        }
    }
    format!("{bytes} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_markdown_with_alignment() {
        let t = Table::new(&["a", "b", "c"], 1).text_columns(&[2]);
        assert!(t.render().starts_with("| a | b | c |\n|---|---:|---|\n"));
        let mut t = Table::new(&["resource", "ns", "ratio"], 1);
        assert!(t.is_empty());
        t.row(["pool", "408", "0.34"]);
        t.row(["arena"]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.render(),
            "| resource | ns | ratio |\n|---|---:|---:|\n| pool | 408 | 0.34 |\n| arena |  |  |\n"
        );
    }

    #[test]
    fn figures_and_ratios() {
        assert_eq!(num(Some(1203.6)), "1204");
        assert_eq!(num(None), "failed");
        assert_eq!(num(Some(f64::NAN)), "failed");
        assert_eq!(ratio(Some(408.0), Some(1204.0)), "0.34");
        assert_eq!(ratio(Some(46.0), Some(1204.0)), "0.038");
        assert_eq!(ratio(Some(1.0), None), "n/a");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "n/a");
        assert_eq!(with_ratio(Some(1204.0), Some(1204.0)), "1204 (1.00)");
        assert_eq!(with_ratio(None, Some(1.0)), "failed");
        assert_eq!(mib(Some(3 << 20)), "3 MiB");
        assert_eq!(mib(None), "n/a");
        assert_eq!(size_name(64 << 10), "64 KiB");
        assert_eq!(size_name(4 << 20), "4 MiB");
        assert_eq!(size_name(1 << 30), "1 GiB");
        assert_eq!(size_name(1000), "1000 B");
    }
}
