//! [`LoggingResourceAdaptor`]: writes RMM's memory-event CSV for every allocation and free.

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rmm_stream::CudaStreamView;
use rmm_sys::DevicePtr;

use super::{current_thread_number, EventLine, EventTime, MemoryEvent, HEADER};
use crate::error::{MrError, MrResult};
use crate::resource::{DeviceMemoryResource, SharedResource};

/// The environment variable naming the default log file (RMM's `RMM_LOG_FILE`).
pub const LOG_FILE_ENV: &str = "RMM_LOG_FILE";

/// A destination of the log.
type Sink = Mutex<Box<dyn Write + Send>>;

fn lock(sink: &Sink) -> MutexGuard<'_, Box<dyn Write + Send>> {
    // A writer that panicked mid-row may have written part of it; the log stays usable.
    sink.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Logging<U> {
    upstream: U,
    sinks: Box<[Sink]>,
    auto_flush: bool,
    utc_offset_secs: i32,
    write_errors: AtomicU64,
}

impl<U> Logging<U> {
    /// Formats `event` (outside any lock) and writes the row to every sink, holding each
    /// sink's lock only for the write (and the flush with `auto_flush`).
    ///
    /// A writer that panics counts as a failed write: the panic is caught here, so it can
    /// neither lose an allocation the upstream already made nor stop a free from reaching the
    /// upstream (its message is still printed by the panic hook).
    fn log(&self, event: &MemoryEvent) {
        let line = EventLine::new(event);
        for sink in self.sinks.iter() {
            let write = || {
                let mut w = lock(sink);
                let written = w.write_all(line.as_bytes());
                if self.auto_flush {
                    written.and_then(|()| w.flush())
                } else {
                    written
                }
            };
            // Unwind safety: after a panic the sink's lock is poisoned, which `lock` accepts;
            // the writer is the caller's and is used again as it is (a row may be torn).
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(write))
                .unwrap_or_else(|_| Err(io::Error::other("the writer panicked")));
            if let Err(e) = result {
                self.write_failed(&e);
            }
        }
    }

    #[cold]
    fn write_failed(&self, e: &io::Error) {
        // As spdlog, a failing sink never fails the allocation; the first failure is reported.
        if self.write_errors.fetch_add(1, Ordering::Relaxed) == 0 {
            log::error!("logging_resource_adaptor: writing the memory-event log failed: {e}");
        }
    }

    fn now(&self) -> EventTime {
        EventTime::now_with_utc_offset(self.utc_offset_secs)
    }
}

impl<U> Drop for Logging<U> {
    fn drop(&mut self) {
        for sink in self.sinks.iter_mut() {
            let w = sink.get_mut().unwrap_or_else(PoisonError::into_inner);
            let _ = w.flush();
        }
    }
}

/// The stream column: the raw handle as given (`0` for the default stream).
fn stream_value(stream: CudaStreamView<'_>) -> u64 {
    stream.value() as usize as u64
}

/// Writes a CSV row for every allocation, failed allocation and deallocation, byte-compatible
/// with RMM's `logging_resource_adaptor` (see [the format](crate::HEADER)), so RMM's replay tools read
/// its logs and [`parse_log`](super::parse_log) reads RMM's.
///
/// As in RMM: the header `Thread,Time,Action,Pointer,Size,Stream` is written when the adaptor
/// is built; `allocate` is logged after the upstream succeeded; a failure logs
/// `allocate failure` with pointer `(nil)` and returns the upstream's error; `free` is logged
/// **before** the upstream frees (so a reused address can never appear allocated before it was
/// freed); 0-byte requests are logged; the `Stream` column is the raw handle
/// ([`CudaStreamView::value`]). A log file is truncated on open; `auto_flush` flushes every
/// sink after every row (slow).
///
/// Differences from RMM: the `Thread` column is [`current_thread_number`] and the `Time` column
/// UTC unless a UTC offset is given in its [options](LoggingOptions) (RMM's
/// replay parser ignores both); a failing sink never fails an allocation (errors are counted in
/// [`write_errors`](Self::write_errors), the first one logged with [`log::error!`]), and a
/// writer that panics is a failing sink: the panic is caught and counted, the allocation
/// returned (or the free forwarded) as if the row had been written, so nothing leaks.
///
/// Concurrency: each row is formatted on the caller's stack before any lock is taken; each
/// sink's lock is held only for one `write_all` (plus the flush with `auto_flush`). File sinks
/// are buffered: call [`flush`](Self::flush) (or drop the last copy) to see the rows on disk.
/// Copies share the sinks and are equal; adaptors built separately are not.
#[doc(alias = "rmm::mr::logging_resource_adaptor")]
pub struct LoggingResourceAdaptor<U: DeviceMemoryResource = SharedResource> {
    inner: Arc<Logging<U>>,
}

impl<U: DeviceMemoryResource> Clone for LoggingResourceAdaptor<U> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

/// The log file named by `RMM_LOG_FILE` (RMM's `get_default_filename()`).
///
/// # Errors
/// [`MrError::InvalidArgument`] when the variable is unset or empty.
#[doc(alias = "get_default_filename")]
pub fn default_log_filename() -> MrResult<PathBuf> {
    filename_from_env_value(std::env::var_os(LOG_FILE_ENV))
}

fn filename_from_env_value(value: Option<OsString>) -> MrResult<PathBuf> {
    match value {
        Some(v) if !v.is_empty() => Ok(PathBuf::from(v)),
        _ => Err(MrError::invalid_argument(format!(
            "RMM logging requested without an explicit file name, but {LOG_FILE_ENV} is unset"
        ))),
    }
}

fn io_error(what: impl fmt::Display, e: io::Error) -> MrError {
    MrError::invalid_argument(format!("logging_resource_adaptor: {what}: {e}"))
}

impl<U: DeviceMemoryResource> LoggingResourceAdaptor<U> {
    /// Logs to the file at `path` (created or truncated), RMM's defaults for the rest.
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] when the file cannot be opened or the header not written.
    pub fn new(upstream: U, path: impl AsRef<Path>) -> MrResult<Self> {
        Self::with_options(upstream, LoggingOptions::new().file(path)?)
    }

    /// Logs to the file named by `RMM_LOG_FILE` (RMM's constructor without a file name).
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] when `RMM_LOG_FILE` is unset, or as [`new`](Self::new).
    pub fn from_env(upstream: U) -> MrResult<Self> {
        Self::new(upstream, default_log_filename()?)
    }

    /// Logs to the sinks of `options` (see [`LoggingOptions`]); writes the header to each now.
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] without sinks or when a header cannot be written.
    pub fn with_options(upstream: U, options: LoggingOptions) -> MrResult<Self> {
        let LoggingOptions {
            mut sinks,
            auto_flush,
            utc_offset_secs,
        } = options;
        if sinks.is_empty() {
            return Err(MrError::invalid_argument(
                "logging_resource_adaptor needs at least one sink",
            ));
        }
        for w in &mut sinks {
            super::write_header(w).map_err(|e| io_error("cannot write the header", e))?;
            if auto_flush {
                w.flush()
                    .map_err(|e| io_error("cannot flush the header", e))?;
            }
        }
        Ok(Self {
            inner: Arc::new(Logging {
                upstream,
                sinks: sinks.into_iter().map(Mutex::new).collect(),
                auto_flush,
                utc_offset_secs,
                write_errors: AtomicU64::new(0),
            }),
        })
    }

    /// The upstream resource.
    #[doc(alias = "get_upstream_resource")]
    #[must_use]
    pub fn upstream(&self) -> &U {
        &self.inner.upstream
    }

    /// The CSV header, `Thread,Time,Action,Pointer,Size,Stream`.
    #[must_use]
    pub fn header(&self) -> &'static str {
        HEADER
    }

    /// Flushes every sink.
    ///
    /// # Errors
    /// The first sink error (every sink is flushed regardless).
    pub fn flush(&self) -> io::Result<()> {
        let mut first = Ok(());
        for sink in self.inner.sinks.iter() {
            let r = lock(sink).flush();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Whether every row is flushed as it is written.
    #[must_use]
    pub fn auto_flush(&self) -> bool {
        self.inner.auto_flush
    }

    /// How many row writes (or flushes) failed so far.
    #[must_use]
    pub fn write_errors(&self) -> u64 {
        self.inner.write_errors.load(Ordering::Relaxed)
    }
}

impl<U: DeviceMemoryResource> fmt::Debug for LoggingResourceAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingResourceAdaptor")
            .field("sinks", &self.inner.sinks.len())
            .field("auto_flush", &self.inner.auto_flush)
            .field("utc_offset_secs", &self.inner.utc_offset_secs)
            .field("write_errors", &self.write_errors())
            .field("upstream", &self.inner.upstream)
            .finish()
    }
}

// SAFETY: every pointer handed out is one the upstream (itself bound by this trait's
// contract) handed out, for at least the bytes asked for here, and it goes back to the
// upstream only when it is freed here.
unsafe impl<U: DeviceMemoryResource> DeviceMemoryResource for LoggingResourceAdaptor<U> {
    fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<DevicePtr> {
        let inner = &*self.inner;
        let result = inner.upstream.allocate(stream, bytes, alignment);
        let (thread, time, stream) = (current_thread_number(), inner.now(), stream_value(stream));
        let event = match &result {
            Ok(ptr) => MemoryEvent::allocate(thread, time, ptr.addr(), bytes, stream),
            Err(_) => MemoryEvent::allocate_failure(thread, time, bytes, stream),
        };
        inner.log(&event);
        result
    }

    unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
    ) -> MrResult<()> {
        let inner = &*self.inner;
        inner.log(&MemoryEvent::free(
            current_thread_number(),
            inner.now(),
            ptr.addr(),
            bytes,
            stream_value(stream),
        ));
        // SAFETY: forwarded contract.
        unsafe { inner.upstream.deallocate(stream, ptr, bytes, alignment) }
    }

    crate::resource::resource_tail! {
        is_equal: shared(inner),
        properties: forward(inner.upstream),
        snapshot: forward(inner.upstream),
    }
}

/// How to build a [`LoggingResourceAdaptor`]: its sinks (RMM's file, `std::ostream` and
/// multi-sink constructors), `auto_flush` and the time zone.
///
/// Built with [`new`](Self::new) or `default()` and the chained setters (`file` and `writer`
/// add a sink each); the fields are public. `#[non_exhaustive]`: later options do not break
/// callers.
///
/// ```no_run
/// # use rmm_mr::{CudaMemoryResource, LoggingOptions, LoggingResourceAdaptor};
/// let options = LoggingOptions::new()
///     .file("rmm_log.csv")?
///     .writer(std::io::stderr())
///     .auto_flush(true);
/// let mr = LoggingResourceAdaptor::with_options(CudaMemoryResource::new(), options)?;
/// # Ok::<(), rmm_mr::MrError>(())
/// ```
#[derive(Default)]
#[non_exhaustive]
pub struct LoggingOptions {
    /// Where every row goes (at least one is needed).
    pub sinks: Vec<Box<dyn Write + Send>>,
    /// Flush every sink after every row (RMM's `auto_flush`; default `false`).
    pub auto_flush: bool,
    /// Write the `Time` column as local time for a zone this many seconds east of UTC
    /// (default 0: UTC).
    pub utc_offset_secs: i32,
}

impl fmt::Debug for LoggingOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingOptions")
            .field("sinks", &self.sinks.len())
            .field("auto_flush", &self.auto_flush)
            .field("utc_offset_secs", &self.utc_offset_secs)
            .finish()
    }
}

impl LoggingOptions {
    /// No sink yet, RMM's defaults for the rest (no `auto_flush`, UTC).
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a (buffered) file sink at `path`, created or truncated now.
    ///
    /// # Errors
    /// [`MrError::InvalidArgument`] when the file cannot be created.
    pub fn file(mut self, path: impl AsRef<Path>) -> MrResult<Self> {
        let path = path.as_ref();
        let file = File::create(path)
            .map_err(|e| io_error(format_args!("cannot open {}", path.display()), e))?;
        self.sinks.push(Box::new(BufWriter::new(file)));
        Ok(self)
    }

    /// Adds `writer` as a sink (e.g. [`std::io::stdout()`]).
    #[must_use]
    pub fn writer(mut self, writer: impl Write + Send + 'static) -> Self {
        self.sinks.push(Box::new(writer));
        self
    }

    /// Sets the field `sinks`.
    #[must_use]
    pub fn sinks(mut self, sinks: impl IntoIterator<Item = Box<dyn Write + Send>>) -> Self {
        self.sinks = sinks.into_iter().collect();
        self
    }

    /// Sets the field `auto_flush`.
    #[must_use]
    pub fn auto_flush(mut self, auto_flush: bool) -> Self {
        self.auto_flush = auto_flush;
        self
    }

    /// Sets the field `utc_offset_secs`.
    #[must_use]
    pub fn utc_offset_secs(mut self, secs: i32) -> Self {
        self.utc_offset_secs = secs;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptors::logging::{parse_log, parse_log_str, Action};
    use crate::testing::{Hooked, HostMockResource};
    use std::sync::atomic::AtomicUsize;

    fn s() -> CudaStreamView<'static> {
        CudaStreamView::default()
    }

    /// A writer into shared memory, counting flushes.
    #[derive(Clone, Default)]
    struct SharedBuf {
        bytes: Arc<Mutex<Vec<u8>>>,
        flushes: Arc<AtomicUsize>,
    }

    impl SharedBuf {
        fn text(&self) -> String {
            String::from_utf8(self.bytes.lock().unwrap().clone()).unwrap()
        }
    }

    impl Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            self.flushes.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    /// A writer that always fails.
    struct Broken;

    impl Write for Broken {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("disk on fire"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A fresh, empty temporary directory removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static N: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "rmm_mr_logging_{}_{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }

        fn path(&self, name: &str) -> PathBuf {
            self.0.join(name)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn expect_events(events: &[MemoryEvent], expected: &[(Action, usize, DevicePtr)]) {
        let got: Vec<_> = events
            .iter()
            .map(|e| (e.action, e.size, DevicePtr::from_raw(e.pointer)))
            .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn filename_constructor() {
        let dir = TempDir::new();
        let path = dir.path("test.txt");
        let mr = LoggingResourceAdaptor::new(HostMockResource::new(), &path).unwrap();
        let p0 = mr.allocate(s(), 100, 256).unwrap();
        let p1 = mr.allocate(s(), 42, 256).unwrap();
        // SAFETY: both came from `mr` with these sizes.
        unsafe {
            mr.deallocate(s(), p0, 100, 256).unwrap();
            mr.deallocate(s(), p1, 42, 256).unwrap();
        }
        mr.flush().unwrap();
        let events = parse_log(io::BufReader::new(File::open(&path).unwrap())).unwrap();
        expect_events(
            &events,
            &[
                (Action::Allocate, 100, p0),
                (Action::Allocate, 42, p1),
                (Action::Free, 100, p0),
                (Action::Free, 42, p1),
            ],
        );
        let thread = current_thread_number();
        assert!(events.iter().all(|e| e.thread == thread && e.stream == 0));
    }

    #[test]
    fn file_is_truncated_on_open() {
        let dir = TempDir::new();
        let path = dir.path("old.csv");
        std::fs::write(&path, "garbage that is not a log\nmore garbage\n").unwrap();
        let mr = LoggingResourceAdaptor::new(HostMockResource::new(), &path).unwrap();
        let p = mr.allocate(s(), 7, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 7, 256).unwrap() };
        drop(mr); // flushes the buffered file
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("Thread,Time,Action,Pointer,Size,Stream\n"),
            "{text}"
        );
        assert_eq!(parse_log_str(&text).unwrap().len(), 2);
    }

    #[test]
    fn unopenable_file_is_an_error() {
        let dir = TempDir::new();
        let e = LoggingResourceAdaptor::new(HostMockResource::new(), dir.path("no/such/dir.csv"))
            .unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)), "{e}");
    }

    #[test]
    fn multi_sink_constructor_writes_identical_logs() {
        let (a, b) = (SharedBuf::default(), SharedBuf::default());
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().sinks([
                Box::new(a.clone()) as Box<dyn Write + Send>,
                Box::new(b.clone()),
            ]),
        )
        .unwrap();
        let p0 = mr.allocate(s(), 99, 256).unwrap();
        // SAFETY: `p0` came from `mr`.
        unsafe { mr.deallocate(s(), p0, 99, 256).unwrap() };
        let p1 = mr.allocate(s(), 42, 256).unwrap();
        // SAFETY: `p1` came from `mr`.
        unsafe { mr.deallocate(s(), p1, 42, 256).unwrap() };
        assert_eq!(a.text(), b.text());
        expect_events(
            &parse_log_str(&a.text()).unwrap(),
            &[
                (Action::Allocate, 99, p0),
                (Action::Free, 99, p0),
                (Action::Allocate, 42, p1),
                (Action::Free, 42, p1),
            ],
        );
    }

    #[test]
    fn allocate_failure_logs_nil_and_returns_the_error() {
        let up = HostMockResource::new();
        let buf = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            up.clone(),
            LoggingOptions::new().writer(buf.clone()),
        )
        .unwrap();
        let p = mr.allocate(s(), 99, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 99, 256).unwrap() };
        up.fail_next_allocations(1);
        let e = mr.allocate(s(), 1 << 40, 256).unwrap_err();
        assert!(e.is_out_of_memory());
        let text = buf.text();
        let last = text.lines().last().unwrap();
        assert!(
            last.ends_with(",allocate failure,(nil),1099511627776,0"),
            "{last}"
        );
        expect_events(
            &parse_log_str(&text).unwrap(),
            &[
                (Action::Allocate, 99, p),
                (Action::Free, 99, p),
                (Action::AllocateFailure, 1 << 40, DevicePtr::NULL),
            ],
        );
    }

    #[test]
    fn header_is_the_first_line() {
        let buf = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(buf.clone()),
        )
        .unwrap();
        let p = mr.allocate(s(), 100, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 100, 256).unwrap() };
        assert_eq!(buf.text().lines().next(), Some(mr.header()));
        assert_eq!(mr.header(), "Thread,Time,Action,Pointer,Size,Stream");
    }

    #[test]
    fn zero_bytes_and_streams_are_logged() {
        let buf = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(buf.clone()),
        )
        .unwrap();
        let p = mr.allocate(CudaStreamView::per_thread(), 0, 256).unwrap();
        // SAFETY: a 0-byte allocation from `mr`.
        unsafe { mr.deallocate(CudaStreamView::legacy(), p, 0, 256).unwrap() };
        let events = parse_log_str(&buf.text()).unwrap();
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].action, events[0].pointer), (Action::Allocate, 0));
        assert_eq!(events[0].stream, stream_value(CudaStreamView::per_thread()));
        assert_eq!(events[1].stream, stream_value(CudaStreamView::legacy()));
        assert!(
            buf.text().contains(",allocate,(nil),0,0x2\n"),
            "{}",
            buf.text()
        );
    }

    #[test]
    fn free_is_logged_before_the_upstream_frees() {
        let buf = SharedBuf::default();
        let checked = Arc::new(AtomicUsize::new(0));
        // When asked to free, the upstream checks that the free row is already written.
        let up = Hooked::default();
        let (log, seen) = (Arc::clone(&buf.bytes), Arc::clone(&checked));
        up.set_hook(move |ptr, bytes| {
            let text = String::from_utf8(log.lock().unwrap().clone()).unwrap();
            let row = format!(",free,{ptr},{bytes},0\n");
            assert!(text.ends_with(&row), "{text}");
            seen.fetch_add(1, Ordering::SeqCst);
        });
        let mr =
            LoggingResourceAdaptor::with_options(up, LoggingOptions::new().writer(buf)).unwrap();
        let p = mr.allocate(s(), 512, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 512, 256).unwrap() };
        assert_eq!(checked.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn auto_flush_flushes_every_row() {
        let buf = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(buf.clone()).auto_flush(true),
        )
        .unwrap();
        assert!(mr.auto_flush());
        let after_header = buf.flushes.load(Ordering::SeqCst);
        assert_eq!(after_header, 1);
        let p = mr.allocate(s(), 1, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 1, 256).unwrap() };
        assert_eq!(buf.flushes.load(Ordering::SeqCst), 3);

        let quiet = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(quiet.clone()),
        )
        .unwrap();
        let p = mr.allocate(s(), 1, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 1, 256).unwrap() };
        assert_eq!(quiet.flushes.load(Ordering::SeqCst), 0);
        mr.flush().unwrap();
        assert_eq!(quiet.flushes.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn utc_offset_shifts_the_time_column() {
        let (utc, east) = (SharedBuf::default(), SharedBuf::default());
        let a = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(utc.clone()),
        )
        .unwrap();
        let b = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new()
                .writer(east.clone())
                .utc_offset_secs(3 * 3600),
        )
        .unwrap();
        let pa = a.allocate(s(), 1, 256).unwrap();
        let pb = b.allocate(s(), 1, 256).unwrap();
        let ta = parse_log_str(&utc.text()).unwrap()[0].time;
        let tb = parse_log_str(&east.text()).unwrap()[0].time;
        let diff = (i64::from(tb.hours()) - i64::from(ta.hours())).rem_euclid(24);
        // The minute may roll over between the two reads.
        assert!(
            diff == 3 || (diff == 4 && tb.minutes() == 0),
            "{ta} vs {tb}"
        );
        // SAFETY: each came from its adaptor.
        unsafe {
            a.deallocate(s(), pa, 1, 256).unwrap();
            b.deallocate(s(), pb, 1, 256).unwrap();
        }
    }

    #[test]
    fn failing_sink_does_not_fail_allocations() {
        let good = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(good.clone()),
        )
        .unwrap();
        assert_eq!(mr.write_errors(), 0);
        let e = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(Broken),
        )
        .unwrap_err();
        assert!(
            matches!(e, MrError::InvalidArgument(_)),
            "header failure: {e}"
        );

        // A sink that breaks after the header.
        #[derive(Clone)]
        struct BreaksLater(Arc<AtomicUsize>);
        impl Write for BreaksLater {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                    Ok(buf.len())
                } else {
                    Err(io::Error::other("disk full"))
                }
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let good = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new()
                .writer(BreaksLater(Arc::new(AtomicUsize::new(0))))
                .writer(good.clone()),
        )
        .unwrap();
        let p = mr.allocate(s(), 10, 256).unwrap();
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 10, 256).unwrap() };
        assert_eq!(mr.write_errors(), 2);
        assert_eq!(
            parse_log_str(&good.text()).unwrap().len(),
            2,
            "other sinks still log"
        );
    }

    /// A writer that panics at every write while armed.
    #[derive(Clone, Default)]
    struct Panics(Arc<std::sync::atomic::AtomicBool>);

    impl Write for Panics {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            assert!(!self.0.load(Ordering::SeqCst), "injected writer panic");
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_panicking_writer_neither_leaks_nor_fails_calls() {
        let mock = HostMockResource::new();
        let panics = Panics::default();
        let good = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            mock.clone(),
            LoggingOptions::new()
                .writer(panics.clone())
                .writer(good.clone()),
        )
        .unwrap();
        panics.0.store(true, Ordering::SeqCst);
        // The upstream allocated before the row is written: the pointer must come back.
        let p = mr.allocate(s(), 100, 256).unwrap();
        assert_eq!(mock.live_allocations(), 1);
        // The free's row is written before the upstream frees: the free must still happen.
        // SAFETY: `p` came from `mr`.
        unsafe { mr.deallocate(s(), p, 100, 256).unwrap() };
        assert_eq!(mock.live_allocations(), 0);
        assert_eq!(mr.write_errors(), 2);
        assert_eq!(
            parse_log_str(&good.text()).unwrap().len(),
            2,
            "the other sink"
        );
        // The panicking sink is usable again once it stops panicking.
        panics.0.store(false, Ordering::SeqCst);
        let q = mr.allocate(s(), 100, 256).unwrap();
        // SAFETY: `q` came from `mr`.
        unsafe { mr.deallocate(s(), q, 100, 256).unwrap() };
        assert_eq!((mr.write_errors(), mock.live_allocations()), (2, 0));
    }

    #[test]
    fn no_sinks_is_an_error() {
        let e =
            LoggingResourceAdaptor::with_options(HostMockResource::new(), LoggingOptions::new())
                .unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)));
        assert!(LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().sinks([])
        )
        .is_err());
    }

    #[test]
    fn env_path_is_required() {
        let e = filename_from_env_value(None).unwrap_err();
        assert!(matches!(e, MrError::InvalidArgument(_)));
        assert!(e.to_string().contains("RMM_LOG_FILE is unset"), "{e}");
        assert!(filename_from_env_value(Some(OsString::new())).is_err());
        assert_eq!(
            filename_from_env_value(Some("/tmp/x.csv".into())).unwrap(),
            PathBuf::from("/tmp/x.csv")
        );
    }

    #[test]
    fn concurrent_rows_are_whole_and_complete() {
        const THREADS: usize = 4;
        const ROUNDS: usize = 500;
        let buf = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            HostMockResource::new(),
            LoggingOptions::new().writer(buf.clone()),
        )
        .unwrap();
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let mr = &mr;
                sc.spawn(move || {
                    for i in 0..ROUNDS {
                        let bytes = 1 + t * 1000 + i;
                        let p = mr.allocate(s(), bytes, 256).unwrap();
                        // SAFETY: `p` came from `mr` with `bytes`.
                        unsafe { mr.deallocate(s(), p, bytes, 256).unwrap() };
                    }
                });
            }
        });
        let events = parse_log_str(&buf.text()).unwrap();
        assert_eq!(events.len(), THREADS * ROUNDS * 2);
        let mut threads: Vec<u64> = events.iter().map(|e| e.thread).collect();
        threads.sort_unstable();
        threads.dedup();
        assert_eq!(threads.len(), THREADS);
        // Per thread, rows alternate allocate/free of the same pointer and size.
        for t in threads {
            let mine: Vec<&MemoryEvent> = events.iter().filter(|e| e.thread == t).collect();
            for pair in mine.chunks(2) {
                assert_eq!(pair[0].action, Action::Allocate);
                assert_eq!(pair[1].action, Action::Free);
                assert_eq!(
                    (pair[0].pointer, pair[0].size),
                    (pair[1].pointer, pair[1].size)
                );
            }
        }
    }

    #[test]
    fn equality_and_shared_ownership() {
        let up = HostMockResource::new();
        let buf = SharedBuf::default();
        let mr = LoggingResourceAdaptor::with_options(
            up.clone(),
            LoggingOptions::new().writer(buf.clone()),
        )
        .unwrap();
        let copy = mr.clone();
        assert!(copy.is_equal(&mr) && mr.is_equal(&copy));
        let other = LoggingResourceAdaptor::with_options(
            up.clone(),
            LoggingOptions::new().writer(buf.clone()),
        )
        .unwrap();
        assert!(!mr.is_equal(&other));
        assert!(mr.upstream().is_equal(&up));
        let p = copy.allocate(s(), 64, 256).unwrap();
        drop(copy);
        // SAFETY: `p` came from a copy of `mr`.
        unsafe { mr.deallocate(s(), p, 64, 256).unwrap() };
        assert_eq!(up.live_allocations(), 0);
    }
}
