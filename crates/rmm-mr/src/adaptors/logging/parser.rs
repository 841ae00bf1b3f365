//! Reading memory-event CSV logs, RMM's own included (the job of `parse_csv` in RMM's
//! `benchmarks/utilities/log_parser.hpp`).
//!
//! Like RMM's parser this one finds columns **by header name** (extra columns are ignored, order
//! does not matter), maps the pointer text `(nil)` to `0`, reads pointers as hexadecimal with or
//! without `0x`, and accepts only the actions `allocate`, `allocate failure` and `free`.
//! It is stricter where RMM's is accidentally lenient, and reports every problem as a
//! [`CsvError`] carrying the 1-based line number:
//!
//! - the `Time` column is parsed into an [`EventTime`] (RMM ignores it);
//! - the `Stream` column is read as a hex handle (`0`, `0x2`, `0x55d0c0a8e2f0`); RMM reads it with
//!   a base-10 conversion, which turns every `0x…` stream into `0`;
//! - numbers must be plain digits (no sign, no trailing junk), every row must have as many fields
//!   as the header.
//!
//! Tolerated: a UTF-8 byte-order mark, `\r\n` line ends, whitespace around fields and at line
//! ends, blank lines between rows.

use std::fmt;
use std::io::{self, BufRead};

use super::event::{Action, MemoryEvent};
use super::event_time::EventTime;

/// A column of the memory-event CSV.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Column {
    /// `Thread`.
    Thread,
    /// `Time`.
    Time,
    /// `Action`.
    Action,
    /// `Pointer`.
    Pointer,
    /// `Size`.
    Size,
    /// `Stream`.
    Stream,
}

impl Column {
    /// All columns in the order RMM writes them.
    pub const ALL: [Column; 6] = [
        Column::Thread,
        Column::Time,
        Column::Action,
        Column::Pointer,
        Column::Size,
        Column::Stream,
    ];

    /// The column's header name.
    pub const fn name(self) -> &'static str {
        match self {
            Column::Thread => "Thread",
            Column::Time => "Time",
            Column::Action => "Action",
            Column::Pointer => "Pointer",
            Column::Size => "Size",
            Column::Stream => "Stream",
        }
    }
}

impl fmt::Display for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a memory-event log could not be read.
#[derive(Debug)]
pub enum CsvError {
    /// Reading the input failed.
    Io(io::Error),
    /// The input was empty: no header line.
    MissingHeader,
    /// The header lacks a required column.
    MissingColumn {
        /// The column not found.
        column: Column,
    },
    /// The header names a required column twice.
    DuplicateColumn {
        /// The repeated column.
        column: Column,
    },
    /// A line is not valid UTF-8.
    InvalidUtf8 {
        /// 1-based line number.
        line: usize,
    },
    /// A row has a different number of fields than the header (RMM: "Size mismatch in columns
    /// of parsed log.").
    FieldCount {
        /// 1-based line number.
        line: usize,
        /// Fields in the header.
        expected: usize,
        /// Fields in this row.
        found: usize,
    },
    /// A field could not be read (for `Action`, RMM says "Invalid action string.").
    InvalidField {
        /// 1-based line number.
        line: usize,
        /// The column of the field.
        column: Column,
        /// The field's text (trimmed).
        value: String,
    },
}

impl fmt::Display for CsvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CsvError::Io(e) => write!(f, "reading the memory-event log failed: {e}"),
            CsvError::MissingHeader => f.write_str("memory-event log is empty (no header line)"),
            CsvError::MissingColumn { column } => {
                write!(f, "memory-event log header lacks the column {column}")
            }
            CsvError::DuplicateColumn { column } => {
                write!(f, "memory-event log header names the column {column} twice")
            }
            CsvError::InvalidUtf8 { line } => write!(f, "line {line}: not valid UTF-8"),
            CsvError::FieldCount {
                line,
                expected,
                found,
            } => write!(
                f,
                "line {line}: {found} fields where the header has {expected} (size mismatch in \
                 columns of parsed log)"
            ),
            CsvError::InvalidField {
                line,
                column: Column::Action,
                value,
            } => write!(f, "line {line}: invalid action string {value:?}"),
            CsvError::InvalidField {
                line,
                column,
                value,
            } => write!(f, "line {line}: invalid {column} field {value:?}"),
        }
    }
}

impl std::error::Error for CsvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CsvError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for CsvError {
    fn from(e: io::Error) -> Self {
        CsvError::Io(e)
    }
}

/// Reads a whole memory-event log: the header, then one [`MemoryEvent`] per non-blank row, in
/// file order (the position in the returned vector is RMM's event `index`).
#[doc(alias = "rmm::detail::parse_csv")]
#[doc(alias = "parse_csv")]
pub fn parse_log<R: BufRead>(reader: R) -> Result<Vec<MemoryEvent>, CsvError> {
    let mut events = Vec::new();
    parse_rows(reader, |_, event| events.push(event))?;
    Ok(events)
}

/// [`parse_log`], with each event's 1-based line number in the input (blank lines are skipped,
/// so a line number is not always its index + 2): what a tool needs to name the row of an event.
pub fn parse_log_lines<R: BufRead>(reader: R) -> Result<Vec<(usize, MemoryEvent)>, CsvError> {
    let mut events = Vec::new();
    parse_rows(reader, |line, event| events.push((line, event)))?;
    Ok(events)
}

/// Reads the header, then hands every non-blank row to `push` with its line number.
fn parse_rows<R: BufRead>(
    mut reader: R,
    mut push: impl FnMut(usize, MemoryEvent),
) -> Result<(), CsvError> {
    let mut raw = Vec::with_capacity(128);
    let mut line_no = 0usize;

    if reader.read_until(b'\n', &mut raw)? == 0 {
        return Err(CsvError::MissingHeader);
    }
    line_no += 1;
    let header = line_text(&raw, line_no)?;
    let layout = Layout::from_header(header.strip_prefix('\u{feff}').unwrap_or(header))?;

    loop {
        raw.clear();
        if reader.read_until(b'\n', &mut raw)? == 0 {
            return Ok(());
        }
        line_no += 1;
        let text = line_text(&raw, line_no)?;
        if text.is_empty() {
            continue;
        }
        push(line_no, layout.parse_row(text, line_no)?);
    }
}

/// [`parse_log`] over a string.
pub fn parse_log_str(text: &str) -> Result<Vec<MemoryEvent>, CsvError> {
    parse_log(text.as_bytes())
}

/// The line as text with its terminator and trailing whitespace removed.
fn line_text(raw: &[u8], line: usize) -> Result<&str, CsvError> {
    let text = std::str::from_utf8(raw).map_err(|_| CsvError::InvalidUtf8 { line })?;
    Ok(text.trim_end())
}

/// Where each required column sits in a row.
struct Layout {
    /// Index of each column of [`Column::ALL`].
    index: [usize; 6],
    /// Number of fields in the header.
    fields: usize,
}

impl Layout {
    fn from_header(header: &str) -> Result<Layout, CsvError> {
        let mut index = [usize::MAX; 6];
        let mut fields = 0;
        for (i, name) in header.split(',').enumerate() {
            fields += 1;
            let name = name.trim();
            if let Some(k) = Column::ALL.iter().position(|c| c.name() == name) {
                if index[k] != usize::MAX {
                    return Err(CsvError::DuplicateColumn {
                        column: Column::ALL[k],
                    });
                }
                index[k] = i;
            }
        }
        if let Some(k) = index.iter().position(|&i| i == usize::MAX) {
            return Err(CsvError::MissingColumn {
                column: Column::ALL[k],
            });
        }
        Ok(Layout { index, fields })
    }

    fn parse_row(&self, row: &str, line: usize) -> Result<MemoryEvent, CsvError> {
        // A row has at most a handful of fields; collect their bounds without allocating.
        let mut cells: [&str; 6] = [""; 6];
        let mut found = 0;
        for (i, cell) in row.split(',').enumerate() {
            found += 1;
            if let Some(k) = self.index.iter().position(|&at| at == i) {
                cells[k] = cell.trim();
            }
        }
        if found != self.fields {
            return Err(CsvError::FieldCount {
                line,
                expected: self.fields,
                found,
            });
        }
        let bad = |column: Column| CsvError::InvalidField {
            line,
            column,
            value: cells[column_slot(column)].to_owned(),
        };
        let thread = parse_decimal(cells[0]).ok_or_else(|| bad(Column::Thread))?;
        let time = EventTime::parse(cells[1]).ok_or_else(|| bad(Column::Time))?;
        let action = Action::from_text(cells[2]).ok_or_else(|| bad(Column::Action))?;
        let pointer = parse_pointer(cells[3]).ok_or_else(|| bad(Column::Pointer))?;
        let size = parse_decimal(cells[4])
            .and_then(|s| usize::try_from(s).ok())
            .ok_or_else(|| bad(Column::Size))?;
        let stream = parse_hex(cells[5]).ok_or_else(|| bad(Column::Stream))?;
        Ok(MemoryEvent {
            thread,
            time,
            action,
            pointer,
            size,
            stream,
        })
    }
}

fn column_slot(column: Column) -> usize {
    Column::ALL.iter().position(|&c| c == column).unwrap_or(0)
}

/// Plain decimal digits fitting a u64.
fn parse_decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// `%p` text: `(nil)` or hex digits with an optional `0x`/`0X`.
fn parse_pointer(text: &str) -> Option<u64> {
    if text == "(nil)" {
        Some(0)
    } else {
        parse_hex(text)
    }
}

/// Hex digits with an optional `0x`/`0X` prefix, fitting a u64.
fn parse_hex(text: &str) -> Option<u64> {
    let digits = text
        .strip_prefix("0x")
        .or_else(|| text.strip_prefix("0X"))
        .unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(digits, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptors::logging::{write_event, write_header};
    use proptest::prelude::*;

    const RMM_LOG: &str = "Thread,Time,Action,Pointer,Size,Stream\n\
        140210031454016,14:03:27.512345,allocate,0x7f3a1c000000,100,0\n\
        140210031454016,14:03:27.512400,allocate failure,(nil),1099511627776,0\n\
        140210031454017,14:03:27.513001,free,0x7f3a1c000000,100,0x2\n";

    fn t(h: u32, m: u32, s: u32, us: u32) -> EventTime {
        EventTime::new(h, m, s, us).unwrap()
    }

    #[test]
    fn parses_an_rmm_log() {
        let events = parse_log_str(RMM_LOG).unwrap();
        assert_eq!(
            events,
            vec![
                MemoryEvent::allocate(
                    140_210_031_454_016,
                    t(14, 3, 27, 512_345),
                    0x7f3a_1c00_0000,
                    100,
                    0
                ),
                MemoryEvent::allocate_failure(
                    140_210_031_454_016,
                    t(14, 3, 27, 512_400),
                    1 << 40,
                    0
                ),
                MemoryEvent::free(
                    140_210_031_454_017,
                    t(14, 3, 27, 513_001),
                    0x7f3a_1c00_0000,
                    100,
                    2
                ),
            ]
        );
    }

    #[test]
    fn tolerates_crlf_bom_whitespace_and_blank_lines() {
        let text = "\u{feff}Thread, Time ,Action,Pointer,Size,Stream \r\n\
            \r\n\
            1, 00:00:01.000002 ,free, 0X1F ,3,0x2  \r\n\
            \n\
            2,00:00:01.000003,allocate,1f,4,7f\r\n";
        let events = parse_log_str(text).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0], MemoryEvent::free(1, t(0, 0, 1, 2), 0x1f, 3, 2));
        assert_eq!(
            events[1],
            MemoryEvent::allocate(2, t(0, 0, 1, 3), 0x1f, 4, 0x7f)
        );
    }

    #[test]
    fn line_numbers_count_every_line() {
        let text = "Thread,Time,Action,Pointer,Size,Stream\n\
            \n\
            1,00:00:01.000002,free,0x1f,3,0x2\n\
            \r\n\
            \n\
            2,00:00:01.000003,allocate,1f,4,7f\n";
        let numbered = parse_log_lines(text.as_bytes()).unwrap();
        let lines: Vec<usize> = numbered.iter().map(|&(line, _)| line).collect();
        assert_eq!(lines, [3, 6]);
        let events: Vec<MemoryEvent> = numbered.into_iter().map(|(_, e)| e).collect();
        assert_eq!(events, parse_log_str(text).unwrap());
    }

    #[test]
    fn finds_columns_by_name_and_ignores_extras() {
        let text = "Stream,Extra,Size,Pointer,Action,Time,Thread\n0x2,zz,64,0x100,allocate,01:02:03.000004,9\n";
        let events = parse_log_str(text).unwrap();
        assert_eq!(
            events,
            vec![MemoryEvent::allocate(9, t(1, 2, 3, 4), 0x100, 64, 2)]
        );
    }

    #[test]
    fn header_only_is_an_empty_log() {
        assert!(parse_log_str("Thread,Time,Action,Pointer,Size,Stream\n")
            .unwrap()
            .is_empty());
        assert!(parse_log_str("Thread,Time,Action,Pointer,Size,Stream")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn header_errors() {
        assert!(matches!(parse_log_str(""), Err(CsvError::MissingHeader)));
        assert!(matches!(
            parse_log_str("Thread,Time,Action,Pointer,Size\n"),
            Err(CsvError::MissingColumn {
                column: Column::Stream
            })
        ));
        assert!(matches!(
            parse_log_str("Thread,Time,Action,Pointer,Size,Stream,Size\n"),
            Err(CsvError::DuplicateColumn {
                column: Column::Size
            })
        ));
        // Names are case-sensitive, as in RMM.
        assert!(matches!(
            parse_log_str("thread,Time,Action,Pointer,Size,Stream\n"),
            Err(CsvError::MissingColumn {
                column: Column::Thread
            })
        ));
    }

    fn field_error(row: &str) -> (usize, Column, String) {
        let text = format!("{HEADER}\n1,00:00:00.000000,free,0x1,1,0\n{row}\n");
        match parse_log_str(&text) {
            Err(CsvError::InvalidField {
                line,
                column,
                value,
            }) => (line, column, value),
            other => panic!("expected InvalidField for {row:?}, got {other:?}"),
        }
    }

    use crate::adaptors::logging::HEADER;

    #[test]
    fn field_errors_name_line_and_column() {
        let cases: &[(&str, Column, &str)] = &[
            ("x1,00:00:00.000000,free,0x1,1,0", Column::Thread, "x1"),
            ("-1,00:00:00.000000,free,0x1,1,0", Column::Thread, "-1"),
            ("+1,00:00:00.000000,free,0x1,1,0", Column::Thread, "+1"),
            (
                "18446744073709551616,00:00:00.000000,free,0x1,1,0",
                Column::Thread,
                "18446744073709551616",
            ),
            ("1,00:00:00,free,0x1,1,0", Column::Time, "00:00:00"),
            ("1,00:00:00.000000,Free,0x1,1,0", Column::Action, "Free"),
            (
                "1,00:00:00.000000,deallocate,0x1,1,0",
                Column::Action,
                "deallocate",
            ),
            ("1,00:00:00.000000,free,nil,1,0", Column::Pointer, "nil"),
            ("1,00:00:00.000000,free,0x,1,0", Column::Pointer, "0x"),
            ("1,00:00:00.000000,free,0x+1,1,0", Column::Pointer, "0x+1"),
            (
                "1,00:00:00.000000,free,0x10000000000000000,1,0",
                Column::Pointer,
                "0x10000000000000000",
            ),
            ("1,00:00:00.000000,free,0x1,1.5,0", Column::Size, "1.5"),
            ("1,00:00:00.000000,free,0x1,,0", Column::Size, ""),
            (
                "1,00:00:00.000000,free,0x1,1,(nil)",
                Column::Stream,
                "(nil)",
            ),
            ("1,00:00:00.000000,free,0x1,1,0xg", Column::Stream, "0xg"),
        ];
        for &(row, column, value) in cases {
            assert_eq!(field_error(row), (3, column, value.to_owned()), "{row}");
        }
    }

    #[test]
    fn field_count_mismatch_is_reported_with_line() {
        let text = format!("{HEADER}\n\n1,00:00:00.000000,free,0x1,1\n");
        match parse_log_str(&text) {
            Err(CsvError::FieldCount {
                line,
                expected,
                found,
            }) => assert_eq!((line, expected, found), (3, 6, 5)),
            other => panic!("expected FieldCount, got {other:?}"),
        }
        let text = format!("{HEADER}\n1,00:00:00.000000,free,0x1,1,0,extra\n");
        assert!(matches!(
            parse_log_str(&text),
            Err(CsvError::FieldCount { found: 7, .. })
        ));
    }

    #[test]
    fn invalid_utf8_and_io_errors_are_typed() {
        let mut bytes = format!("{HEADER}\n").into_bytes();
        bytes.extend_from_slice(b"1,00:00:00.000000,free,0x1,1,\xff\n");
        assert!(matches!(
            parse_log(&bytes[..]),
            Err(CsvError::InvalidUtf8 { line: 2 })
        ));

        struct Failing;
        impl io::Read for Failing {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let err = parse_log(io::BufReader::new(Failing)).unwrap_err();
        assert!(matches!(err, CsvError::Io(_)));
        assert!(err.to_string().contains("disk on fire"));
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn error_messages_mention_rmm_wording() {
        let text = format!("{HEADER}\n1,00:00:00.000000,oops,0x1,1,0\n");
        let msg = parse_log_str(&text).unwrap_err().to_string();
        assert_eq!(msg, "line 2: invalid action string \"oops\"");
    }

    fn arb_event() -> impl Strategy<Value = MemoryEvent> {
        (
            any::<u64>(),
            (0u32..24, 0u32..60, 0u32..=60, 0u32..1_000_000),
            prop_oneof![
                Just(Action::Allocate),
                Just(Action::AllocateFailure),
                Just(Action::Free)
            ],
            prop_oneof![
                Just(0u64),
                any::<u64>(),
                (0u64..1 << 48).prop_map(|p| p << 8)
            ],
            any::<usize>(),
            prop_oneof![Just(0u64), Just(1u64), Just(2u64), any::<u64>()],
        )
            .prop_map(|(thread, (h, m, s, us), action, pointer, size, stream)| {
                MemoryEvent {
                    thread,
                    time: EventTime::new(h, m, s, us).unwrap(),
                    action,
                    // RMM writes a null pointer for every failure.
                    pointer: if action == Action::AllocateFailure {
                        0
                    } else {
                        pointer
                    },
                    size,
                    stream,
                }
            })
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(events in proptest::collection::vec(arb_event(), 0..64)) {
            let mut out = Vec::new();
            write_header(&mut out).unwrap();
            for e in &events {
                write_event(&mut out, e).unwrap();
            }
            prop_assert_eq!(parse_log(&out[..]).unwrap(), events);
        }

        #[test]
        fn parser_never_panics_on_garbage(body in "[ -~\r\n]{0,300}") {
            let text = format!("{HEADER}\n{body}");
            let _ = parse_log_str(&text);
        }
    }
}
