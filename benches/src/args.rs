//! The benchmark binaries' command lines: `--flag VALUE` pairs and bare `--flag`s; unknown
//! flags (cargo's `--bench`) are ignored, bad values are errors.

/// A benchmark's arguments.
#[derive(Debug, Clone, Default)]
pub struct Args {
    list: Vec<String>,
}

impl Args {
    /// The process's arguments, without the program name.
    #[must_use]
    pub fn from_env() -> Self {
        Self::from_vec(std::env::args().skip(1).collect())
    }

    /// These arguments.
    #[must_use]
    pub fn from_vec(list: Vec<String>) -> Self {
        Self { list }
    }

    /// Whether `flag` is present.
    #[must_use]
    pub fn has(&self, flag: &str) -> bool {
        self.list.iter().any(|a| a == flag)
    }

    /// The value after the last `flag`, if any.
    #[must_use]
    pub fn value(&self, flag: &str) -> Option<&str> {
        let i = self.list.iter().rposition(|a| a == flag)?;
        self.list.get(i + 1).map(String::as_str)
    }

    /// `flag`'s value as a number, `default` without it.
    pub fn usize_or(&self, flag: &str, default: usize) -> Result<usize, String> {
        match self.value(flag) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{flag} takes a number, not `{v}`")),
        }
    }

    /// `flag`'s comma-separated numbers, `default` without it.
    pub fn usizes_or(&self, flag: &str, default: &[usize]) -> Result<Vec<usize>, String> {
        match self.value(flag) {
            None => Ok(default.to_vec()),
            Some(v) => {
                let list: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                match list {
                    Ok(l) if !l.is_empty() && !l.contains(&0) => Ok(l),
                    _ => Err(format!(
                        "{flag} takes positive numbers separated by commas, not `{v}`"
                    )),
                }
            }
        }
    }

    /// `flag`'s comma-separated names, if given.
    #[must_use]
    pub fn names(&self, flag: &str) -> Option<Vec<String>> {
        self.value(flag)
            .map(|v| v.split(',').map(str::to_owned).collect())
    }

    /// The arguments that are not flags or flag values, in order (a subcommand and its
    /// files). `takes_value` names the flags that take a value.
    #[must_use]
    pub fn positional(&self, takes_value: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        let mut it = self.list.iter();
        while let Some(a) = it.next() {
            if takes_value.contains(&a.as_str()) {
                it.next();
            } else if !a.starts_with("--") {
                out.push(a.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Args {
        Args::from_vec(s.split_whitespace().map(str::to_owned).collect())
    }

    #[test]
    fn flags_values_and_lists() {
        let a = args("--bench --reps 5 --threads 1,4 --only pool,arena run plan.txt --quick");
        assert!(a.has("--quick") && a.has("--bench") && !a.has("--full"));
        assert_eq!(a.usize_or("--reps", 3), Ok(5));
        assert_eq!(a.usize_or("--ops", 7), Ok(7));
        assert_eq!(a.usizes_or("--threads", &[16]), Ok(vec![1, 4]));
        assert_eq!(a.usizes_or("--sizes", &[1, 2]), Ok(vec![1, 2]));
        assert_eq!(
            a.names("--only"),
            Some(vec!["pool".to_owned(), "arena".to_owned()])
        );
        assert_eq!(
            a.positional(&["--reps", "--threads", "--only"]),
            vec!["run".to_owned(), "plan.txt".to_owned()]
        );
        assert!(args("--reps x")
            .usize_or("--reps", 1)
            .unwrap_err()
            .contains("`x`"));
        assert!(args("--threads 1,0").usizes_or("--threads", &[1]).is_err());
        assert!(args("--threads 1,,2").usizes_or("--threads", &[1]).is_err());
        assert_eq!(args("--reps").value("--reps"), None);
    }
}
