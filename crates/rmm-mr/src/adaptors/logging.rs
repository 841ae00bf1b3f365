//! The pure half of RMM's `logging_resource_adaptor`: the memory-event CSV.
//!
//! RMM's logging adaptor writes one CSV row per allocation, failed allocation and
//! deallocation; its replay benchmark reads such logs back. This module formats rows byte for
//! byte as RMM does ([`write_event`], [`EventLine`], [`HEADER`]) and parses logs written by RMM
//! or by us ([`parse_log`]), so logs move freely between the two. It makes no CUDA calls:
//! pointers and streams are raw `u64` values, and the time is an input ([`EventTime`]).
//!
//! Format:
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140210031454016,14:03:27.512345,allocate,0x7f3a1c000000,100,0
//! 140210031454016,14:03:27.512400,allocate failure,(nil),1099511627776,0
//! 140210031454016,14:03:27.513001,free,0x7f3a1c000000,100,0x2
//! ```
//!
//! RMM writes the header with the spdlog pattern `%v`, then every event with
//! `%t,%H:%M:%S.%f,%v` where the message is `snprintf("<action>,%p,%zu,%s", ptr, bytes,
//! stream)` and the stream text comes from `ostream << std::hex << cudaStream_t`. With glibc and
//! libstdc++ that gives:
//!
//! | column  | RMM source                  | text                                          |
//! |---------|-----------------------------|-----------------------------------------------|
//! | Thread  | spdlog `%t`                 | decimal                                       |
//! | Time    | spdlog `%H:%M:%S.%f`        | `HH:MM:SS.ffffff`                             |
//! | Action  | literal                     | `allocate`, `allocate failure`, `free`        |
//! | Pointer | glibc `%p`                  | `0x` + lowercase hex; null is `(nil)`         |
//! | Size    | `%zu`                       | decimal                                       |
//! | Stream  | libstdc++ `void*` insertion | `0x` + lowercase hex; null is `0`             |
//!
//! Lines end with `\n` (spdlog's default end of line on Linux).
//!
//! Differences from RMM, all outside what the replay parser reads: [`EventTime::now`] gives the
//! UTC time of day where spdlog prints local time, and [`current_thread_number`] gives a
//! process-unique thread number where spdlog prints the kernel thread id.

mod adaptor;
mod csv;
mod event;
mod event_time;
mod parser;
mod thread_number;

pub use adaptor::{default_log_filename, LoggingOptions, LoggingResourceAdaptor, LOG_FILE_ENV};
pub use csv::{format_header, push_event, write_event, write_header, EventLine, HEADER};
pub use event::{Action, MemoryEvent};
pub use event_time::{EventTime, InvalidEventTime};
pub use parser::{parse_log, parse_log_lines, parse_log_str, Column, CsvError};
pub use thread_number::current_thread_number;
