//! [`EventTime`]: the wall-clock time of day in a memory-event log row.
//!
//! RMM writes the `Time` column through spdlog's `%H:%M:%S.%f` flags, which format the
//! **local** time of day (spdlog's default `pattern_time_type::local`) with microseconds and no
//! date. The Rust standard library cannot read the local time zone, so [`EventTime::now`] gives
//! the **UTC** time of day; callers that know their offset use
//! [`EventTime::now_with_utc_offset`]. Only the `Time` column differs, and RMM's replay parser
//! ignores that column, so logs stay interchangeable.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SECONDS_PER_DAY: i64 = 86_400;

/// A time of day with microsecond resolution, as written in the `Time` column
/// (`HH:MM:SS.ffffff`).
///
/// Fields are validated on construction: hours `0..=23`, minutes `0..=59`, seconds `0..=60`
/// (60 allows a leap second, as `struct tm` does) and microseconds `0..=999_999`, so every value
/// formats to exactly 15 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct EventTime {
    hours: u8,
    minutes: u8,
    seconds: u8,
    micros: u32,
}

/// A field of an [`EventTime`] was out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidEventTime {
    /// Hours as given.
    pub hours: u32,
    /// Minutes as given.
    pub minutes: u32,
    /// Seconds as given.
    pub seconds: u32,
    /// Microseconds as given.
    pub micros: u32,
}

impl fmt::Display for InvalidEventTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid time of day {}:{}:{}.{} (expected hours < 24, minutes < 60, seconds <= 60, \
             microseconds < 1000000)",
            self.hours, self.minutes, self.seconds, self.micros
        )
    }
}

impl std::error::Error for InvalidEventTime {}

impl EventTime {
    /// Midnight, `00:00:00.000000`.
    pub const MIDNIGHT: EventTime = EventTime {
        hours: 0,
        minutes: 0,
        seconds: 0,
        micros: 0,
    };

    /// Builds a time of day, checking every field's range.
    pub fn new(
        hours: u32,
        minutes: u32,
        seconds: u32,
        micros: u32,
    ) -> Result<EventTime, InvalidEventTime> {
        if hours < 24 && minutes < 60 && seconds <= 60 && micros < 1_000_000 {
            // The range checks above make the narrowing casts lossless.
            Ok(EventTime {
                hours: hours as u8,
                minutes: minutes as u8,
                seconds: seconds as u8,
                micros,
            })
        } else {
            Err(InvalidEventTime {
                hours,
                minutes,
                seconds,
                micros,
            })
        }
    }

    /// The current UTC time of day from the system clock (see the module docs for why not
    /// local time). A clock set before 1970 reads as midnight.
    pub fn now() -> EventTime {
        EventTime::now_with_utc_offset(0)
    }

    /// The current time of day shifted by `utc_offset_secs` (e.g. `3600` for UTC+1), which is
    /// what spdlog prints when that is the local zone's offset.
    pub fn now_with_utc_offset(utc_offset_secs: i32) -> EventTime {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        EventTime::from_unix_duration(since_epoch, utc_offset_secs)
    }

    /// The time of day of the instant `since_epoch` after the Unix epoch, shifted by
    /// `utc_offset_secs`.
    pub fn from_unix_duration(since_epoch: Duration, utc_offset_secs: i32) -> EventTime {
        // u64 seconds fit an i128 with room for the offset; the remainder is below 86400.
        let secs = i128::from(since_epoch.as_secs()) + i128::from(utc_offset_secs);
        let of_day = secs.rem_euclid(i128::from(SECONDS_PER_DAY)) as u32;
        EventTime {
            hours: (of_day / 3600) as u8,
            minutes: (of_day / 60 % 60) as u8,
            seconds: (of_day % 60) as u8,
            micros: since_epoch.subsec_micros(),
        }
    }

    /// Hours, `0..=23`.
    pub fn hours(&self) -> u32 {
        u32::from(self.hours)
    }

    /// Minutes, `0..=59`.
    pub fn minutes(&self) -> u32 {
        u32::from(self.minutes)
    }

    /// Seconds, `0..=60`.
    pub fn seconds(&self) -> u32 {
        u32::from(self.seconds)
    }

    /// Microseconds within the second, `0..=999_999`.
    pub fn micros(&self) -> u32 {
        self.micros
    }

    /// The 15 bytes `HH:MM:SS.ffffff`.
    pub fn to_bytes(&self) -> [u8; 15] {
        let mut out = *b"00:00:00.000000";
        put_digits(&mut out[0..2], u32::from(self.hours));
        put_digits(&mut out[3..5], u32::from(self.minutes));
        put_digits(&mut out[6..8], u32::from(self.seconds));
        put_digits(&mut out[9..15], self.micros);
        out
    }

    /// Parses `HH:MM:SS.ffffff` (two digits each, six for the microseconds). A `:` before the
    /// microseconds is accepted too, the form RMM's `parse_time` documents. Returns `None` on
    /// any other shape or an out-of-range field.
    pub fn parse(text: &str) -> Option<EventTime> {
        let b = text.as_bytes();
        if b.len() != 15 || b[2] != b':' || b[5] != b':' || !(b[8] == b'.' || b[8] == b':') {
            return None;
        }
        let num = |range: std::ops::Range<usize>| -> Option<u32> {
            b[range].iter().try_fold(0u32, |acc, &c| {
                c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
            })
        };
        EventTime::new(num(0..2)?, num(3..5)?, num(6..8)?, num(9..15)?).ok()
    }
}

/// Writes `value` as zero-padded decimal filling `out` exactly (the caller guarantees it fits).
fn put_digits(out: &mut [u8], mut value: u32) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

impl fmt::Display for EventTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.to_bytes();
        // to_bytes only writes ASCII digits and separators.
        f.write_str(std::str::from_utf8(&bytes).map_err(|_| fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_zero_padded() {
        let t = EventTime::new(4, 3, 7, 512).unwrap();
        assert_eq!(t.to_string(), "04:03:07.000512");
        assert_eq!(EventTime::MIDNIGHT.to_string(), "00:00:00.000000");
        let t = EventTime::new(23, 59, 60, 999_999).unwrap();
        assert_eq!(t.to_string(), "23:59:60.999999");
    }

    #[test]
    fn rejects_out_of_range_fields() {
        assert!(EventTime::new(24, 0, 0, 0).is_err());
        assert!(EventTime::new(0, 60, 0, 0).is_err());
        assert!(EventTime::new(0, 0, 61, 0).is_err());
        let err = EventTime::new(0, 0, 0, 1_000_000).unwrap_err();
        assert_eq!(err.micros, 1_000_000);
        assert!(err.to_string().contains("invalid time of day"));
    }

    #[test]
    fn parses_what_it_formats_and_the_colon_variant() {
        let t = EventTime::new(14, 3, 27, 512_345).unwrap();
        assert_eq!(EventTime::parse("14:03:27.512345"), Some(t));
        assert_eq!(EventTime::parse("14:03:27:512345"), Some(t));
        assert_eq!(EventTime::parse("14:03:27.51234"), None);
        assert_eq!(EventTime::parse("14-03:27.512345"), None);
        assert_eq!(EventTime::parse("24:03:27.512345"), None);
        assert_eq!(EventTime::parse("1a:03:27.512345"), None);
        assert_eq!(EventTime::parse("+1:03:27.512345"), None);
    }

    #[test]
    fn from_unix_duration_splits_the_day() {
        // 2021-01-01T13:14:15.123456Z = 1609506855 s since the epoch.
        let d = Duration::new(1_609_506_855, 123_456_789);
        let t = EventTime::from_unix_duration(d, 0);
        assert_eq!(t.to_string(), "13:14:15.123456");
        // UTC+1 and UTC-14 (wrapping to the previous day).
        assert_eq!(
            EventTime::from_unix_duration(d, 3600).to_string(),
            "14:14:15.123456"
        );
        assert_eq!(
            EventTime::from_unix_duration(d, -14 * 3600).to_string(),
            "23:14:15.123456"
        );
        assert_eq!(
            EventTime::from_unix_duration(Duration::ZERO, -1).to_string(),
            "23:59:59.000000"
        );
    }

    #[test]
    fn now_is_in_range_and_matches_the_clock() {
        let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let t = EventTime::now();
        let after = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let lo = before.as_secs() % 86_400;
        let hi = after.as_secs() % 86_400;
        let got = u64::from(t.hours() * 3600 + t.minutes() * 60 + t.seconds());
        // Allow a midnight wrap between the reads.
        assert!((lo <= got && got <= hi) || hi < lo, "{lo} <= {got} <= {hi}");
        assert!(EventTime::parse(&t.to_string()).is_some());
    }
}
