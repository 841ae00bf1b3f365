//! The memory-event CSV log: the parser never panics, and whatever it accepts re-serialises
//! and re-parses to the same events.
//!
//! [`check`] reads its input two ways:
//!
//! 1. as a log: [`parse_log`] must return (never panic); an error names a line the input has;
//!    accepted events are written back with the writer ([`HEADER`], [`push_event`]), and
//!    that text must parse to the same events and be a fixed point (written again, it is the
//!    same text);
//! 2. as a list of events ([`decode_events`]): written and parsed back, they must be the same
//!    events (every event the logging adaptor can write is readable).

use rmm_mr::{parse_log, parse_log_str, push_event, CsvError, EventTime, MemoryEvent, HEADER};

use crate::input::Bytes;

/// The log text of `events`: the header, then one row per event, each ending in `\n`.
#[must_use]
pub fn serialise(events: &[MemoryEvent]) -> String {
    let mut out = String::with_capacity(HEADER.len() + 1 + 64 * events.len());
    out.push_str(HEADER);
    out.push('\n');
    for event in events {
        push_event(&mut out, event);
    }
    out
}

/// The number of lines of `data` (a last line without `\n` counts).
fn line_count(data: &[u8]) -> usize {
    let newlines = data.iter().filter(|&&b| b == b'\n').count();
    newlines + usize::from(data.last().is_some_and(|&b| b != b'\n'))
}

/// The line an error names, if it names one.
fn error_line(e: &CsvError) -> Option<usize> {
    match e {
        CsvError::InvalidUtf8 { line }
        | CsvError::FieldCount { line, .. }
        | CsvError::InvalidField { line, .. } => Some(*line),
        _ => None,
    }
}

/// Events decoded from bytes: every field in its valid range, so each can be written.
pub fn decode_events(b: &mut Bytes<'_>) -> Vec<MemoryEvent> {
    let mut events = Vec::new();
    while !b.is_empty() && events.len() < 256 {
        let shape = b.u8();
        let thread = u64::from(b.u32()) << 32 | u64::from(b.u32());
        let time = EventTime::new(
            u32::from(b.u8()) % 24,
            u32::from(b.u8()) % 60,
            u32::from(b.u8()) % 61,
            b.u32() % 1_000_000,
        )
        .unwrap_or(EventTime::MIDNIGHT);
        let pointer = u64::from(b.u32()) << 32 | u64::from(b.u32());
        let size = b.u32() as usize * if shape & 0x10 != 0 { 1 << 20 } else { 1 };
        let stream = match shape >> 6 {
            0 => 0,
            1 => 2,
            _ => u64::from(b.u32()) << 16,
        };
        events.push(match shape % 3 {
            0 => MemoryEvent::allocate(thread, time, pointer, size, stream),
            1 => MemoryEvent::allocate_failure(thread, time, size, stream),
            _ => MemoryEvent::free(thread, time, pointer, size, stream),
        });
    }
    events
}

/// Checks the parser on `data` read as a log, and the writer and parser on events decoded from
/// `data`.
///
/// # Errors
///
/// The first broken property.
pub fn check(data: &[u8]) -> Result<(), String> {
    check_log(data)?;
    let events = decode_events(&mut Bytes::new(data));
    let text = serialise(&events);
    match parse_log_str(&text) {
        Ok(back) if back == events => Ok(()),
        Ok(back) => Err(format!(
            "written events read back differently:\n{text}\nwritten {events:?}\nread {back:?}"
        )),
        Err(e) => Err(format!("written events do not parse ({e}):\n{text}")),
    }
}

/// The parser's properties on `data` read as a log.
///
/// # Errors
///
/// The first broken property.
pub fn check_log(data: &[u8]) -> Result<(), String> {
    let lines = line_count(data);
    match parse_log(data) {
        Ok(events) => {
            if events.len() >= lines.max(1) {
                return Err(format!("{} events from {lines} lines", events.len()));
            }
            let text = serialise(&events);
            let again = parse_log_str(&text)
                .map_err(|e| format!("the re-serialised log does not parse ({e}):\n{text}"))?;
            if again != events {
                return Err(format!(
                    "the re-serialised log reads differently:\nfirst {events:?}\nthen {again:?}"
                ));
            }
            let text_again = serialise(&again);
            if text_again != text {
                return Err(format!(
                    "serialising is not a fixed point:\n{text}\nthen\n{text_again}"
                ));
            }
            Ok(())
        }
        Err(e) => {
            if matches!(e, CsvError::MissingHeader) != data.is_empty() {
                return Err(format!("{e} for an input of {} bytes", data.len()));
            }
            if let Some(line) = error_line(&e) {
                if line == 0 || line > lines {
                    return Err(format!("error on line {line} of {lines}: {e}"));
                }
            }
            if e.to_string().is_empty() {
                return Err(format!("{e:?} has an empty message"));
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmm_mr::Action;

    const LOG: &str = "Thread,Time,Action,Pointer,Size,Stream\n\
        140210031454016,14:03:27.512345,allocate,0x7f3a1c000000,100,0\n\
        140210031454016,14:03:27.512400,allocate failure,(nil),1099511627776,0\n\
        140210031454017,14:03:27.513001,free,0x7f3a1c000000,100,0x2\n";

    #[test]
    fn an_rmm_log_round_trips_to_itself() {
        let events = parse_log_str(LOG).unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(serialise(&events), LOG);
        check(LOG.as_bytes()).unwrap();
    }

    #[test]
    fn line_counts() {
        assert_eq!(line_count(b""), 0);
        assert_eq!(line_count(b"a"), 1);
        assert_eq!(line_count(b"a\n"), 1);
        assert_eq!(line_count(b"a\nb"), 2);
        assert_eq!(line_count(b"\n\n"), 2);
    }

    #[test]
    fn bad_logs_are_errors_on_their_lines() {
        for bad in [
            &b""[..],
            b"Thread,Time\n",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,2,3\n",
            b"Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,eat,0x1,1,0\n",
            b"Thread,Time,Action,Pointer,Size,Stream\n\xff\n",
        ] {
            assert!(parse_log(bad).is_err());
            check(bad).unwrap();
        }
    }

    #[test]
    fn decoded_events_cover_every_action() {
        let data: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let events = decode_events(&mut Bytes::new(&data));
        for action in [Action::Allocate, Action::AllocateFailure, Action::Free] {
            assert!(events.iter().any(|e| e.action == action), "{action:?}");
        }
        check(&data).unwrap();
    }
}
