//! `cargo xtask size` and the `size` step of `cargo xtask ci`: how many lines of code the pool's
//! stream-ordered core takes (issue 28: at most [`LIMIT`]).
//!
//! Counted: the lines of the `.rs` files under [`DIRS`] (and the module files beside them) that
//! hold code: not blank, not only a comment (doc comments included), not inside a
//! `#[cfg(test)]` module (`cfg(all(test, ..))` too), and not in a file whose name holds `tests`.

use crate::cargo::{self, Error};
use std::path::{Path, PathBuf};

/// The folders counted, from the workspace root.
pub(crate) const DIRS: &[&str] = &["crates/rmm-mr/src/stream_ordered", "crates/rmm-mr/src/pool"];

/// The most lines the folders may hold together.
pub(crate) const LIMIT: usize = 2_700;

/// Whether the step fails above [`LIMIT`]; until then it only reports.
const ENFORCE: bool = false; // true once the core is within the limit (issue 28)

/// `src` with comments removed and the text of string and character literals blanked (their
/// quotes kept), line for line.
fn code_only(src: &str) -> Vec<String> {
    let s: Vec<char> = src.chars().collect();
    let at = |j: usize| s.get(j).copied().unwrap_or('\0');
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    // Keeps the newlines of skipped text, so that lines stay lines.
    let skip = |out: &mut String, from: usize, to: usize| {
        for c in &s[from..to.min(s.len())] {
            if *c == '\n' {
                out.push('\n');
            }
        }
    };
    while i < s.len() {
        let c = s[i];
        if c == '/' && at(i + 1) == '/' {
            let start = i;
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
            skip(&mut out, start, i);
        } else if c == '/' && at(i + 1) == '*' {
            let start = i;
            let mut depth = 1;
            i += 2;
            while i < s.len() && depth > 0 {
                if s[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                } else {
                    i += 1;
                }
            }
            skip(&mut out, start, i);
        } else if c == '"'
            || (c == 'r' && matches!(at(i + 1), '"' | '#') && !ident_before(&s, i))
            || (c == 'b' && at(i + 1) == '"' && !ident_before(&s, i))
        {
            let start = i;
            let mut j = i;
            if s[j] == 'b' {
                j += 1;
            }
            let raw = s.get(j) == Some(&'r');
            if raw {
                j += 1;
            }
            let mut hashes = 0;
            while raw && at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            if at(j) != '"' {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < s.len() {
                if raw {
                    if s[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#') {
                        j += 1 + hashes;
                        break;
                    }
                } else if s[j] == '\\' {
                    j += 1;
                } else if s[j] == '"' {
                    j += 1;
                    break;
                }
                j += 1;
            }
            // A line of a string that spans lines is a code line: each keeps a quote.
            out.push('"');
            for ch in &s[start..j] {
                if *ch == '\n' {
                    out.push_str("\n\"");
                }
            }
            out.push('"');
            i = j;
        } else if c == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            let mut j = i + 2;
            while j < s.len() && s[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.split('\n').map(str::to_owned).collect()
}

/// Whether `s[i]` continues an identifier (so an `r` or `b` there starts no literal).
fn ident_before(s: &[char], i: usize) -> bool {
    i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_')
}

/// Whether an attribute line makes its item test-only: `#[cfg(test)]`, or `#[cfg(all(..))]` with
/// `test` among the predicates it requires (`#[cfg(all(test, not(loom)))]` too), but not
/// `#[cfg(any(test, ..))]` or `#[cfg(not(test))]`.
fn test_attribute(line: &str) -> bool {
    let Some(inner) = line
        .strip_prefix("#[cfg(")
        .and_then(|l| l.trim_end().strip_suffix(")]"))
    else {
        return false;
    };
    let inner = inner.trim();
    if inner == "test" {
        return true;
    }
    let Some(args) = inner.strip_prefix("all(").and_then(|a| a.strip_suffix(')')) else {
        return false;
    };
    // The predicates of `all`, split at the commas outside parentheses.
    let mut depth = 0;
    let mut start = 0;
    let mut required = Vec::new();
    for (i, c) in args.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                required.push(args[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    required.push(args[start..].trim());
    required.contains(&"test")
}

/// Whether a line declares a module (`mod x`, `pub(crate) mod x`).
fn declares_module(line: &str) -> bool {
    let rest = line
        .strip_prefix("pub")
        .map(|r| match r.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or("", |(_, after)| after),
            None => r,
        })
        .unwrap_or(line);
    rest.trim_start().starts_with("mod ")
}

/// The code lines of one file's text (see the module's page).
pub(crate) fn code_lines(src: &str) -> usize {
    let lines = code_only(src);
    let mut count = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.is_empty() {
            i += 1;
            continue;
        }
        if test_attribute(line) {
            // The attributes and the item they open: a test module is skipped whole.
            let mut j = i + 1;
            while j < lines.len()
                && (lines[j].trim().is_empty() || lines[j].trim().starts_with("#["))
            {
                j += 1;
            }
            if j < lines.len() && declares_module(lines[j].trim()) {
                let mut depth = 0i64;
                let mut opened = false;
                while j < lines.len() {
                    for c in lines[j].chars() {
                        match c {
                            '{' => {
                                depth += 1;
                                opened = true;
                            }
                            '}' => depth -= 1,
                            _ => {}
                        }
                    }
                    let ends = if opened {
                        depth <= 0
                    } else {
                        lines[j].contains(';')
                    };
                    j += 1;
                    if ends {
                        break;
                    }
                }
                i = j;
                continue;
            }
        }
        count += 1;
        i += 1;
    }
    count
}

/// The `.rs` files under `dir` (recursively), but those whose name holds `tests`.
pub(crate) fn files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.is_dir() {
            files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains("tests"))
        {
            out.push(path);
        }
    }
    Ok(())
}

/// The count of each folder of [`DIRS`] under `root` (its module file `x.rs` beside it
/// included).
fn count(root: &Path, per_file: bool) -> Result<Vec<(String, usize)>, Error> {
    let mut out = Vec::new();
    for dir in DIRS {
        let mut list = Vec::new();
        files(&root.join(dir), &mut list)?;
        let beside = root.join(format!("{dir}.rs"));
        if beside.is_file() {
            list.push(beside);
        }
        let mut lines = 0;
        for file in list {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let n = code_lines(&text);
            if per_file {
                let shown = file.strip_prefix(root).unwrap_or(&file);
                println!("size: {:>5} {}", n, shown.display());
            }
            lines += n;
        }
        out.push(((*dir).to_owned(), lines));
    }
    Ok(out)
}

/// Prints the count; an error above [`LIMIT`] when `enforce`.
fn report(counts: &[(String, usize)], enforce: bool) -> Result<(), Error> {
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    for (dir, n) in counts {
        println!("size: {dir}: {n} code lines");
    }
    if total <= LIMIT {
        println!("size: ok ({total} code lines, limit {LIMIT})");
        Ok(())
    } else if enforce {
        Err(format!(
            "{total} code lines in {} (limit {LIMIT}): see xtask/src/size.rs for what counts",
            DIRS.join(" and ")
        ))
    } else {
        println!("size: {total} code lines, above the limit of {LIMIT} (not yet enforced)");
        Ok(())
    }
}

/// The `size` step of `cargo xtask ci`.
pub(crate) fn run_ci() -> Result<(), Error> {
    report(&count(&cargo::repo_root(), false)?, ENFORCE)
}

/// `cargo xtask size [--files]`: the step, with each file's count first when asked.
pub(crate) fn run(per_file: bool) -> Result<(), Error> {
    report(&count(&cargo::repo_root(), per_file)?, ENFORCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blanks_comments_and_test_modules_are_not_code() {
        let src = r##"//! A module page.

/// A doc comment.
pub(crate) struct A; // a trailing comment is still a code line
/* a block
   comment */
fn f() -> &'static str {
    let _ = '{';
    let _ = "// not a comment { ";
    r#"a raw
string"#
}

#[cfg(test)]
mod tests {
    fn t() {}
}

#[cfg(all(test, loom))]
#[path = "x.rs"]
mod loom_tests;

#[cfg(all(test, not(loom)))]
mod more_tests {
    fn t() {}
}

#[cfg(all(feature = "x", not(test)))]
mod not_a_test {}

#[cfg(any(test, feature = "testing"))]
pub(crate) fn hook() {}
"##;
        // `pub(crate) struct A;`, `fn f..`, `let _ = '{';`, `let _ = "..";`, `r#"a raw`,
        // `string"#`, `}`, `#[cfg(all(feature..))]`, `mod not_a_test {}`, `#[cfg(any(..))]`,
        // `pub(crate) fn hook() {}`.
        assert_eq!(code_lines(src), 11);
    }

    #[test]
    fn a_test_only_function_counts_and_braces_in_strings_do_not_end_a_module() {
        let src = "#[cfg(test)]\nfn only_in_tests() {}\n\n#[cfg(test)]\npub(crate) mod tests {\n    const S: &str = \"}\";\n    fn t() {}\n}\nfn after() {}\n";
        assert_eq!(code_lines(src), 3);
    }

    #[test]
    fn the_limit_fails_only_when_enforced() {
        let over = [("a".to_owned(), LIMIT), ("b".to_owned(), 1)];
        assert!(report(&over, true).is_err());
        assert!(report(&over, false).is_ok());
        let under = [("a".to_owned(), LIMIT)];
        assert!(report(&under, true).is_ok());
    }

    #[test]
    fn the_workspace_counts() {
        let counts = count(&cargo::repo_root(), false).unwrap();
        assert_eq!(counts.len(), DIRS.len());
        assert!(counts.iter().all(|(_, n)| *n > 0), "{counts:?}");
    }
}
