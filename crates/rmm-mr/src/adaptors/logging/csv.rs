//! Writing the memory-event CSV byte for byte as RMM's `logging_resource_adaptor` does.
//!
//! The column formats are tabled in the [module docs](super).
//!
//! Formatting goes into a fixed stack buffer ([`EventLine`]): nothing is allocated per event.

use std::{fmt, io};

use super::event::MemoryEvent;

/// The header line, without its terminator: RMM's `logging_resource_adaptor::header()`.
#[doc(alias = "rmm::mr::logging_resource_adaptor::header")]
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Longest possible row: 20 (thread) + 15 (time) + 16 (action) + 18 (pointer) + 20 (size)
/// + 18 (stream) + 5 commas + newline = 113 bytes.
const LINE_CAPACITY: usize = 128;

/// The CSV header (RMM's `header()`), without a line terminator.
#[doc(alias = "header")]
pub fn format_header() -> &'static str {
    HEADER
}

/// Writes the header line (with its `\n`), as RMM does once when a log is opened.
pub fn write_header<W: io::Write + ?Sized>(out: &mut W) -> io::Result<()> {
    out.write_all(b"Thread,Time,Action,Pointer,Size,Stream\n")
}

/// Writes one event row (with its `\n`) in a single `write_all`, allocating nothing.
pub fn write_event<W: io::Write + ?Sized>(out: &mut W, event: &MemoryEvent) -> io::Result<()> {
    out.write_all(EventLine::new(event).as_bytes())
}

/// Appends one event row (with its `\n`) to `out`; allocates only if `out` must grow.
pub fn push_event(out: &mut String, event: &MemoryEvent) {
    out.push_str(EventLine::new(event).as_str());
}

/// One formatted event row, held in a stack buffer.
#[derive(Clone, Copy)]
pub struct EventLine {
    buf: [u8; LINE_CAPACITY],
    len: usize,
}

impl EventLine {
    /// Formats `event` as a CSV row followed by `\n`.
    pub fn new(event: &MemoryEvent) -> EventLine {
        let mut line = EventLine {
            buf: [0; LINE_CAPACITY],
            len: 0,
        };
        line.push_decimal(event.thread);
        line.push(b",");
        line.push(&event.time.to_bytes());
        line.push(b",");
        line.push(event.action.as_str().as_bytes());
        line.push(b",");
        if event.pointer == 0 {
            line.push(b"(nil)");
        } else {
            line.push_prefixed_hex(event.pointer);
        }
        line.push(b",");
        // usize is at most 64 bits on every supported target.
        line.push_decimal(event.size as u64);
        line.push(b",");
        if event.stream == 0 {
            line.push(b"0");
        } else {
            line.push_prefixed_hex(event.stream);
        }
        line.push(b"\n");
        line
    }

    /// The row including its trailing `\n`.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The row including its trailing `\n`.
    pub fn as_str(&self) -> &str {
        // Only ASCII is ever pushed; the fallback is unreachable in practice.
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    /// The row without its trailing `\n`.
    pub fn row(&self) -> &str {
        let s = self.as_str();
        s.strip_suffix('\n').unwrap_or(s)
    }

    fn push(&mut self, bytes: &[u8]) {
        // LINE_CAPACITY covers the longest row (see its comment), so this never truncates;
        // `min` keeps a wrong bound from ever panicking.
        let end = (self.len + bytes.len()).min(LINE_CAPACITY);
        let n = end - self.len;
        self.buf[self.len..end].copy_from_slice(&bytes[..n]);
        self.len = end;
    }

    fn push_decimal(&mut self, mut value: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (value % 10) as u8;
            value /= 10;
            if value == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }

    fn push_prefixed_hex(&mut self, mut value: u64) {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut digits = [0u8; 18];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = HEX[(value & 0xf) as usize];
            value >>= 4;
            if value == 0 {
                break;
            }
        }
        i -= 2;
        digits[i] = b'0';
        digits[i + 1] = b'x';
        self.push(&digits[i..]);
    }
}

impl std::fmt::Debug for EventLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EventLine").field(&self.as_str()).finish()
    }
}

/// The CSV row ([`EventLine::row`]).
impl fmt::Display for MemoryEvent {
    /// The CSV row without its line terminator.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EventLine::new(self).row())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptors::logging::{Action, EventTime};

    fn at(h: u32, m: u32, s: u32, us: u32) -> EventTime {
        EventTime::new(h, m, s, us).unwrap()
    }

    #[test]
    fn header_matches_rmm() {
        assert_eq!(format_header(), "Thread,Time,Action,Pointer,Size,Stream");
        let mut out = Vec::new();
        write_header(&mut out).unwrap();
        assert_eq!(out, b"Thread,Time,Action,Pointer,Size,Stream\n");
    }

    #[test]
    fn golden_allocate_row() {
        let e = MemoryEvent::allocate(
            140_210_031_454_016,
            at(14, 3, 27, 512_345),
            0x7f3a_1c00_0000,
            100,
            0,
        );
        let mut out = Vec::new();
        write_event(&mut out, &e).unwrap();
        assert_eq!(
            out,
            b"140210031454016,14:03:27.512345,allocate,0x7f3a1c000000,100,0\n"
        );
    }

    #[test]
    fn golden_failure_row_prints_nil_pointer() {
        let e = MemoryEvent::allocate_failure(4242, at(0, 0, 1, 7), 1 << 40, 0);
        assert_eq!(
            EventLine::new(&e).as_str(),
            "4242,00:00:01.000007,allocate failure,(nil),1099511627776,0\n"
        );
    }

    #[test]
    fn golden_free_row_on_per_thread_default_stream() {
        let e = MemoryEvent::free(7, at(23, 59, 59, 999_999), 0xABCDEF00, 0, 2);
        assert_eq!(
            EventLine::new(&e).row(),
            "7,23:59:59.999999,free,0xabcdef00,0,0x2"
        );
    }

    #[test]
    fn golden_extremes_fit_the_buffer() {
        let e = MemoryEvent {
            thread: u64::MAX,
            time: at(23, 59, 60, 999_999),
            action: Action::AllocateFailure,
            pointer: u64::MAX,
            size: usize::MAX,
            stream: u64::MAX,
        };
        let line = EventLine::new(&e);
        let expected = format!(
            "{},23:59:60.999999,allocate failure,0xffffffffffffffff,{},0xffffffffffffffff\n",
            u64::MAX,
            usize::MAX
        );
        assert_eq!(line.as_str(), expected);
        assert!(line.as_bytes().len() <= LINE_CAPACITY);
        // Smallest values: thread 0, pointer 1, stream 1.
        let e = MemoryEvent::allocate(0, EventTime::MIDNIGHT, 1, 0, 1);
        assert_eq!(
            EventLine::new(&e).row(),
            "0,00:00:00.000000,allocate,0x1,0,0x1"
        );
    }

    #[test]
    fn push_event_appends() {
        let mut s = String::from(HEADER);
        s.push('\n');
        push_event(
            &mut s,
            &MemoryEvent::free(1, EventTime::MIDNIGHT, 0x100, 5, 0),
        );
        assert_eq!(
            s,
            "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:00.000000,free,0x100,5,0\n"
        );
    }

    #[test]
    fn display_is_the_row_without_newline() {
        let t = EventTime::new(14, 3, 27, 512_345).unwrap();
        let e = MemoryEvent::allocate(140_210_031_454_016, t, 0x7f3a_1c00_0000, 100, 0);
        assert_eq!(
            e.to_string(),
            "140210031454016,14:03:27.512345,allocate,0x7f3a1c000000,100,0"
        );
    }
}
