//! The C API's per-device table: which configuration each device has, its built stack, and the
//! lookup every allocation makes.
//!
//! A configuration is either for every device (the template: each device builds its stack on
//! its first use) or for listed devices (built at once). Lookups are the hot path: the built
//! stack of each device below [`FAST_DEVICES`] is published in a fixed array of atomic
//! pointers, so a lookup is one load, with no lock, no thread-local and no reference count;
//! only a device not built yet (or above the array) takes the lock. A stack, once built, is
//! never dropped while the table lives: a replaced one is retired, because a thread that loaded
//! its pointer just before the replacement may still allocate or free through it for a moment,
//! and it must never free memory under an allocation made through it.
//!
//! The table's lock is never held while a stack is built or gives its memory back (both may
//! wait for the device): a configuration in flight and a device being built on first use are
//! marked in the table, and the calls that would see them half done wait, with the lock
//! released, until they are over.

use std::collections::{HashMap, HashSet};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use rmm::{DeviceId, MrResult};

use crate::abi::RmmRsStatistics;
use crate::config::Config;
use crate::stack::{build_on_device, DeviceState};
use crate::status::{
    CResult, Error, RMM_RS_ERROR_BUSY, RMM_RS_ERROR_INVALID_FREE, RMM_RS_ERROR_NOT_CONFIGURED,
};

/// Builds a device's stack from a configuration.
pub(crate) type Builder = fn(&Config, DeviceId) -> MrResult<DeviceState>;

/// Devices at or above this ordinal are looked up under the lock every time (no slot in the
/// array of built stacks).
pub(crate) const FAST_DEVICES: usize = 256;

#[derive(Default)]
struct Inner {
    template: Option<Config>,
    explicit: HashMap<i32, Config>,
    built: HashMap<i32, Arc<DeviceState>>,
    retired: Vec<Arc<DeviceState>>,
    /// A configuration is being installed: its replaced stacks give their memory back and its
    /// new ones are built, with the lock released.
    configuring: bool,
    /// Devices whose stack is being built on first use, with the lock released.
    building: HashSet<i32>,
}

impl Inner {
    fn config_of(&self, device: i32) -> Option<&Config> {
        self.explicit.get(&device).or(self.template.as_ref())
    }
}

/// The table. The entry points use [`Registry::global`]; tests make their own.
pub(crate) struct Registry {
    /// Device `d`'s built stack, or null: what lookups read. Written under `inner`'s lock only.
    /// Invariant: a non-null pointer is that of an `Arc` held in `inner.built` or
    /// `inner.retired`, and an `Arc` leaves `built` only for `retired`, which is never emptied:
    /// so the stack it points to lives as long as the registry.
    fast: Box<[AtomicPtr<DeviceState>]>,
    inner: Mutex<Inner>,
    /// Signalled when a configuration or a build in flight ends.
    settled: Condvar,
    build: Builder,
}

/// A configuration (`None`) or a device's first build (`Some(device)`) in flight, marked in
/// the table while it runs with the lock released; the mark goes when this drops (also on an
/// error or a panic), and the threads waiting for it are woken.
struct InFlight<'a> {
    registry: &'a Registry,
    device: Option<i32>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut inner = self.registry.lock();
        match self.device {
            None => inner.configuring = false,
            Some(device) => {
                inner.building.remove(&device);
            }
        }
        drop(inner);
        self.registry.settled.notify_all();
    }
}

/// The table of the C API.
static GLOBAL: OnceLock<Registry> = OnceLock::new();

fn invalid_device(device: i32) -> Error {
    Error::invalid_argument(format!(
        "device must be an ordinal (0 or more), not {device}"
    ))
}

impl Registry {
    /// An empty table whose devices are built with `build`.
    #[must_use]
    pub(crate) fn new(build: Builder) -> Self {
        Self {
            fast: (0..FAST_DEVICES)
                .map(|_| AtomicPtr::new(ptr::null_mut()))
                .collect(),
            inner: Mutex::new(Inner::default()),
            settled: Condvar::new(),
            build,
        }
    }

    /// The table of the C API, building stacks on the GPU (unless [`Registry::install_global`]
    /// came first).
    pub(crate) fn global() -> &'static Registry {
        GLOBAL.get_or_init(|| Registry::new(build_on_device))
    }

    /// Makes the table of the C API one that builds its stacks with `build`; false (nothing
    /// changed) once the table exists.
    #[cfg(feature = "testing")]
    pub(crate) fn install_global(build: Builder) -> bool {
        GLOBAL.set(Registry::new(build)).is_ok()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Locks the table once `ready` holds, waiting (with the lock released) for the
    /// configurations and builds in flight it names.
    fn lock_when(&self, ready: impl Fn(&Inner) -> bool) -> MutexGuard<'_, Inner> {
        let mut inner = self.lock();
        while !ready(&inner) {
            inner = self.settled.wait(inner).unwrap_or_else(|e| e.into_inner());
        }
        inner
    }

    /// Locks the table once no configuration is in flight and `device` is not being built.
    fn lock_settled(&self, device: i32) -> MutexGuard<'_, Inner> {
        self.lock_when(|i| !i.configuring && !i.building.contains(&device))
    }

    /// Publishes `state` (held in `built`, under the lock `_inner`) as `device`'s stack for
    /// lookups, or unpublishes the device (`None`).
    fn publish(
        &self,
        _inner: &MutexGuard<'_, Inner>,
        device: i32,
        state: Option<&Arc<DeviceState>>,
    ) {
        let slot = usize::try_from(device).ok().and_then(|i| self.fast.get(i));
        if let Some(slot) = slot {
            let p = state.map_or(ptr::null_mut(), |s| Arc::as_ptr(s).cast_mut());
            // Release: a lookup that reads the pointer sees the built stack.
            slot.store(p, Ordering::Release);
        }
    }

    /// Installs `config` (see `rmm_rs_configure`): for every device when it lists none, else for
    /// its devices, built now. Fails with `RMM_RS_ERROR_BUSY`, changing nothing, while a stack
    /// it would replace has allocations outstanding; a device that fails to build leaves every
    /// device as it was. One configuration at a time; the replaced stacks give their memory
    /// back and the new ones are built with the table's lock released.
    pub(crate) fn configure(&self, config: Config) -> CResult<()> {
        config.validate()?;
        let mut inner = self.lock_when(|i| !i.configuring && i.building.is_empty());
        let replaced: Vec<i32> = if config.devices.is_empty() {
            inner.built.keys().copied().collect()
        } else {
            config
                .devices
                .iter()
                .map(|d| d.0)
                .filter(|d| inner.built.contains_key(d))
                .collect()
        };
        for d in &replaced {
            let n = inner.built[d].outstanding();
            if n > 0 {
                return Err(Error::new(
                    RMM_RS_ERROR_BUSY,
                    format!("device {d} has {n} allocations outstanding from its current configuration; free them before configuring it again"),
                ));
            }
        }
        // Retire first, so that a new pool can take the memory the old one gave back.
        let old: Vec<(i32, Arc<DeviceState>)> = replaced
            .iter()
            .filter_map(|d| inner.built.remove(d).map(|s| (*d, s)))
            .collect();
        for (d, _) in &old {
            self.publish(&inner, *d, None);
        }
        inner.configuring = true;
        drop(inner);
        let _in_flight = InFlight {
            registry: self,
            device: None,
        };
        // Giving memory back synchronizes the device: no lock held.
        for (_, s) in &old {
            s.retire();
        }
        if config.devices.is_empty() {
            let mut inner = self.lock();
            inner.retired.extend(old.into_iter().map(|(_, s)| s));
            inner.explicit.clear();
            inner.template = Some(config);
            return Ok(());
        }
        let mut fresh = Vec::with_capacity(config.devices.len());
        for &device in &config.devices {
            match (self.build)(&config, device) {
                Ok(s) => fresh.push((device.0, Arc::new(s))),
                Err(e) => {
                    // The old stacks gave back only free memory and still work: reinstate.
                    for (_, s) in &fresh {
                        s.retire();
                    }
                    let mut inner = self.lock();
                    inner.retired.extend(fresh.into_iter().map(|(_, s)| s));
                    for (d, s) in &old {
                        self.publish(&inner, *d, Some(s));
                    }
                    inner.built.extend(old);
                    return Err(Error::from(e));
                }
            }
        }
        let mut inner = self.lock();
        inner.retired.extend(old.into_iter().map(|(_, s)| s));
        for (d, s) in fresh {
            inner.explicit.insert(d, config.clone());
            self.publish(&inner, d, Some(&s));
            inner.built.insert(d, s);
        }
        Ok(())
    }

    /// The stack of `device`, built now from its configuration if it is not built yet and
    /// `build` says so.
    fn state_slow(&self, device: i32, build: bool) -> CResult<Arc<DeviceState>> {
        let mut inner = self.lock_settled(device);
        if let Some(s) = inner.built.get(&device) {
            return Ok(Arc::clone(s));
        }
        if !build {
            return Err(Error::new(
                RMM_RS_ERROR_INVALID_FREE,
                format!("device {device} has no memory from rmm-rs: nothing was allocated on it"),
            ));
        }
        let config = inner.config_of(device).cloned().ok_or_else(|| {
            Error::new(
                RMM_RS_ERROR_NOT_CONFIGURED,
                format!("device {device} is not configured: call rmm_rs_configure first"),
            )
        })?;
        inner.building.insert(device);
        drop(inner);
        let _in_flight = InFlight {
            registry: self,
            device: Some(device),
        };
        // Building may wait for the device (a pool's first chunk, a driver pool's reserve):
        // no lock held.
        let state = Arc::new((self.build)(&config, DeviceId(device))?);
        let mut inner = self.lock();
        self.publish(&inner, device, Some(&state));
        inner.built.insert(device, Arc::clone(&state));
        Ok(state)
    }

    /// Runs `f` on the stack of `device` (built on first use when `build`; else a device not
    /// built is `RMM_RS_ERROR_INVALID_FREE`, as only frees ask so). The hot path: one atomic
    /// load.
    #[inline]
    pub(crate) fn with_state<R>(
        &self,
        device: i32,
        build: bool,
        f: impl FnOnce(&DeviceState) -> R,
    ) -> CResult<R> {
        let index = usize::try_from(device).map_err(|_| invalid_device(device))?;
        // Acquire: pairs with `publish`.
        let published = self
            .fast
            .get(index)
            .map_or(ptr::null_mut(), |slot| slot.load(Ordering::Acquire));
        let slow;
        let state = if published.is_null() {
            slow = self.state_slow(device, build)?;
            &*slow
        } else {
            // SAFETY: a published pointer names a stack the registry keeps alive as long as
            // itself (the invariant of `fast`), and `self` is borrowed for the call.
            unsafe { &*published }
        };
        // One call site, so that `f` is inlined here.
        Ok(f(state))
    }

    /// The statistics of `device`: zeros for a configured device not built yet.
    pub(crate) fn statistics(&self, device: i32) -> CResult<RmmRsStatistics> {
        if device < 0 {
            return Err(invalid_device(device));
        }
        let inner = self.lock_settled(device);
        if let Some(s) = inner.built.get(&device) {
            return Ok(s.statistics());
        }
        match inner.config_of(device) {
            Some(config) => Ok(RmmRsStatistics {
                statistics_enabled: i32::from(config.statistics),
                device,
                ..RmmRsStatistics::default()
            }),
            None => Err(Error::new(
                RMM_RS_ERROR_NOT_CONFIGURED,
                format!("device {device} is not configured"),
            )),
        }
    }

    /// Resets the peaks of `device` to the current values (nothing to do for a configured
    /// device not built yet).
    pub(crate) fn reset_peak_statistics(&self, device: i32) -> CResult<()> {
        if device < 0 {
            return Err(invalid_device(device));
        }
        let inner = self.lock_settled(device);
        if let Some(s) = inner.built.get(&device) {
            s.reset_peaks();
            return Ok(());
        }
        match inner.config_of(device) {
            Some(_) => Ok(()),
            None => Err(Error::new(
                RMM_RS_ERROR_NOT_CONFIGURED,
                format!("device {device} is not configured"),
            )),
        }
    }

    /// Writes the snapshot of `device` to `path` in PyTorch's pickle format (an empty one for
    /// a configured device not built yet).
    pub(crate) fn dump_snapshot(&self, device: i32, path: &std::path::Path) -> CResult<()> {
        if device < 0 {
            return Err(invalid_device(device));
        }
        let state = {
            let inner = self.lock_settled(device);
            match inner.built.get(&device) {
                Some(s) => Some(Arc::clone(s)),
                None if inner.config_of(device).is_some() => None,
                None => {
                    return Err(Error::new(
                        RMM_RS_ERROR_NOT_CONFIGURED,
                        format!("device {device} is not configured"),
                    ))
                }
            }
        };
        let snapshot = match state {
            Some(s) => s.snapshot()?,
            None => rmm::Snapshot::default(),
        };
        let write = || -> std::io::Result<()> {
            let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
            snapshot.write_pickle(&mut file)?;
            std::io::Write::flush(&mut file)
        };
        write().map_err(|e| {
            Error::invalid_argument(format!(
                "writing the snapshot of device {device} to {}: {e}",
                path.display()
            ))
        })
    }

    /// Writes out the log of `device`, or of every built device for -1.
    pub(crate) fn flush_log(&self, device: i32) -> CResult<()> {
        if device < -1 {
            return Err(invalid_device(device));
        }
        let states: Vec<Arc<DeviceState>> = {
            let inner = self.lock();
            inner
                .built
                .iter()
                .filter(|(d, _)| device == -1 || **d == device)
                .map(|(_, s)| Arc::clone(s))
                .collect()
        };
        for s in states {
            s.flush_log().map_err(|e| {
                Error::invalid_argument(format!("writing the log of device {device}: {e}"))
            })?;
        }
        Ok(())
    }

    /// [`Registry::flush_log`] of every device, unless another thread holds the table's lock
    /// (what runs at exit, where waiting for a thread that may never run again would hang the
    /// process).
    pub(crate) fn flush_logs_if_idle(&self) {
        let states: Vec<Arc<DeviceState>> = match self.inner.try_lock() {
            Ok(inner) => inner.built.values().cloned().collect(),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                p.into_inner().built.values().cloned().collect()
            }
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        for s in states {
            let _ = s.flush_log();
        }
    }

    /// Stacks replaced so far (tests).
    #[cfg(test)]
    pub(crate) fn retired(&self) -> usize {
        self.lock().retired.len()
    }
}

#[cfg(test)]
mod tests {
    use std::io::BufReader;
    use std::path::PathBuf;

    use rmm::mr::{parse_log, Action};
    use rmm::CudaStreamView;

    use super::*;
    use crate::config::ResourceKind;
    use crate::ffi::{alloc_in, free_in};
    use crate::status::{
        RMM_RS_ERROR_INVALID_ARGUMENT, RMM_RS_ERROR_NO_DEVICE, RMM_RS_ERROR_OUT_OF_MEMORY,
    };
    use crate::test_support::{build_on_host, build_on_host_but_7};

    const S: CudaStreamView<'static> = CudaStreamView::legacy();

    fn every_device(config: Config) -> Config {
        Config {
            devices: Vec::new(),
            ..config
        }
    }

    fn on(devices: &[i32], config: Config) -> Config {
        Config {
            devices: devices.iter().map(|&d| DeviceId(d)).collect(),
            ..config
        }
    }

    fn alloc(r: &Registry, bytes: isize, device: i32) -> CResult<*mut std::ffi::c_void> {
        alloc_in(r, bytes, device, S)
    }

    fn free(r: &Registry, p: *mut std::ffi::c_void, bytes: isize, device: i32) -> CResult<()> {
        // SAFETY: the tests free what they allocated, with its size (or, on purpose, pointers
        // the resource detects as wrong); the memory is host memory nobody uses.
        unsafe { free_in(r, p, bytes, device, S) }
    }

    #[test]
    fn nothing_is_configured_at_first() {
        let r = Registry::new(build_on_host);
        let e = alloc(&r, 256, 0).unwrap_err();
        assert_eq!(e.code, RMM_RS_ERROR_NOT_CONFIGURED, "{e}");
        assert!(e.message.contains("rmm_rs_configure"), "{e}");
        assert_eq!(
            r.statistics(0).unwrap_err().code,
            RMM_RS_ERROR_NOT_CONFIGURED
        );
        assert_eq!(
            alloc(&r, 256, -1).unwrap_err().code,
            RMM_RS_ERROR_INVALID_ARGUMENT
        );
        assert!(r.flush_log(-1).is_ok());
        assert_eq!(
            r.flush_log(-2).unwrap_err().code,
            RMM_RS_ERROR_INVALID_ARGUMENT
        );
    }

    #[test]
    fn every_device_builds_on_first_use() {
        let r = Registry::new(build_on_host);
        r.configure(every_device(Config::default())).unwrap();
        let before = r.statistics(3).unwrap();
        assert_eq!(
            (before.statistics_enabled, before.device, before.pool_size),
            (1, 3, 0)
        );
        let p = alloc(&r, 1000, 3).unwrap();
        assert!(!p.is_null() && p as usize % 256 == 0);
        let s = r.statistics(3).unwrap();
        assert_eq!((s.current_bytes, s.current_allocations), (1000, 1));
        assert_eq!(s.outstanding_allocations, 1);
        assert!(s.pool_size >= 1024, "{s:?}");
        free(&r, p, 1000, 3).unwrap();
        let s = r.statistics(3).unwrap();
        assert_eq!(
            (s.current_bytes, s.peak_bytes, s.total_bytes),
            (0, 1000, 1000)
        );
        assert_eq!((s.outstanding_allocations, s.failed_frees), (0, 0));
        // Zero bytes: null, and nothing counted.
        assert!(alloc(&r, 0, 3).unwrap().is_null());
        free(&r, std::ptr::null_mut(), 0, 3).unwrap();
        assert_eq!(r.statistics(3).unwrap().total_allocations, 1);
        let e = alloc(&r, -5, 3).unwrap_err();
        assert!(e.message.contains("not -5"), "{e}");
    }

    #[test]
    fn reconfiguring_waits_for_outstanding_memory() {
        let r = Registry::new(build_on_host);
        r.configure(every_device(Config::default())).unwrap();
        let p = alloc(&r, 512, 0).unwrap();
        let e = r
            .configure(every_device(Config {
                statistics: false,
                ..Config::default()
            }))
            .unwrap_err();
        assert_eq!(e.code, RMM_RS_ERROR_BUSY);
        assert!(e.message.contains("device 0 has 1 allocations"), "{e}");
        assert_eq!(
            r.statistics(0).unwrap().statistics_enabled,
            1,
            "changed anyway"
        );
        let e = r.configure(on(&[0], Config::default())).unwrap_err();
        assert_eq!(e.code, RMM_RS_ERROR_BUSY);
        free(&r, p, 512, 0).unwrap();
        r.configure(every_device(Config {
            statistics: false,
            ..Config::default()
        }))
        .unwrap();
        assert_eq!(r.retired(), 1);
        let s = r.statistics(0).unwrap();
        assert_eq!((s.statistics_enabled, s.total_allocations), (0, 0));
        // The counters of the C API run with statistics off too.
        let p = alloc(&r, 512, 0).unwrap();
        assert_eq!(r.statistics(0).unwrap().outstanding_allocations, 1);
        free(&r, p, 512, 0).unwrap();
    }

    #[test]
    fn listed_devices_are_built_at_once_or_not_at_all() {
        let r = Registry::new(build_on_host_but_7);
        r.configure(on(&[1], Config::default())).unwrap();
        // Built now: a device not listed is not configured.
        assert_eq!(
            alloc(&r, 256, 2).unwrap_err().code,
            RMM_RS_ERROR_NOT_CONFIGURED
        );
        let p = alloc(&r, 256, 1).unwrap();
        free(&r, p, 256, 1).unwrap();
        let s1 = r.statistics(1).unwrap();
        assert_eq!(s1.total_allocations, 1);
        // Device 7 fails: device 1 keeps its stack and counters (its pool gave its free
        // memory back to make room, and grows again on demand).
        let e = r
            .configure(on(
                &[1, 7],
                Config {
                    statistics: false,
                    ..Config::default()
                },
            ))
            .unwrap_err();
        assert_eq!(e.code, RMM_RS_ERROR_NO_DEVICE, "{e}");
        assert_eq!(
            r.statistics(1).unwrap(),
            RmmRsStatistics { pool_size: 0, ..s1 }
        );
        let p = alloc(&r, 256, 1).unwrap();
        free(&r, p, 256, 1).unwrap();
        assert_eq!(r.statistics(1).unwrap().total_allocations, 2);
        assert_eq!(
            r.statistics(7).unwrap_err().code,
            RMM_RS_ERROR_NOT_CONFIGURED
        );
        // A template does not override a listed device's configuration... until it replaces
        // everything.
        r.configure(every_device(Config {
            kind: ResourceKind::Cuda,
            ..Config::default()
        }))
        .unwrap();
        assert!(alloc(&r, 256, 2).is_ok_and(|p| free(&r, p, 256, 2).is_ok()));
        assert_eq!(r.statistics(1).unwrap().total_allocations, 0);
    }

    #[test]
    fn exhaustion_and_wrong_frees_are_typed_and_counted() {
        let r = Registry::new(build_on_host);
        r.configure(every_device(Config {
            maximum_pool_size: Some(1 << 20),
            ..Config::default()
        }))
        .unwrap();
        let e = alloc(&r, 2 << 20, 0).unwrap_err();
        assert_eq!(e.code, RMM_RS_ERROR_OUT_OF_MEMORY, "{e}");
        assert!(
            e.message.starts_with("std::bad_alloc: out_of_memory: "),
            "{e}"
        );
        let p = alloc(&r, 4096, 0).unwrap();
        let wrong = (p as usize + 256) as *mut std::ffi::c_void;
        assert_eq!(
            free(&r, wrong, 4096, 0).unwrap_err().code,
            crate::status::RMM_RS_ERROR_INVALID_FREE
        );
        assert_eq!(
            free(&r, p, 100, 0).unwrap_err().code,
            crate::status::RMM_RS_ERROR_INVALID_FREE
        );
        free(&r, p, 4096, 0).unwrap();
        assert_eq!(
            free(&r, p, 4096, 0).unwrap_err().code,
            crate::status::RMM_RS_ERROR_INVALID_FREE
        );
        // A device that never allocated has nothing to free, and is not built to say so.
        let e = free(&r, p, 4096, 5).unwrap_err();
        assert!(e.message.contains("nothing was allocated"), "{e}");
        assert_eq!(r.statistics(5).unwrap().pool_size, 0);
        let s = r.statistics(0).unwrap();
        assert_eq!((s.failed_allocations, s.failed_frees), (1, 3));
        assert_eq!((s.outstanding_allocations, s.current_bytes), (0, 0));
        // Training goes on after the failure.
        let q = alloc(&r, 1 << 19, 0).unwrap();
        free(&r, q, 1 << 19, 0).unwrap();
    }

    #[test]
    fn peaks_reset_to_the_current_values_and_out_of_memory_is_counted_apart() {
        for (kind, log) in [
            (ResourceKind::Pool, false),
            (ResourceKind::Pool, true),
            (ResourceKind::Cuda, false),
        ] {
            let dir = std::env::temp_dir().join(format!("rmm-capi-peaks-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let r = Registry::new(build_on_host);
            r.configure(every_device(Config {
                kind,
                initial_pool_size: (kind == ResourceKind::Pool).then_some(0),
                maximum_pool_size: (kind == ResourceKind::Pool).then_some(4 << 20),
                log_file: log.then(|| dir.join("peaks.csv")),
                ..Config::default()
            }))
            .unwrap();
            let what = format!("{kind:?}, log {log}");
            // Configured, not built: nothing to reset.
            r.reset_peak_statistics(0).unwrap();
            let a = alloc(&r, 1 << 20, 0).unwrap();
            let b = alloc(&r, 2 << 20, 0).unwrap();
            if kind == ResourceKind::Pool {
                let e = alloc(&r, 8 << 20, 0).unwrap_err();
                assert_eq!(e.code, RMM_RS_ERROR_OUT_OF_MEMORY, "{what}: {e}");
            }
            free(&r, b, 2 << 20, 0).unwrap();
            // A refused free is a failure, not an out-of-memory one.
            let _ = free(&r, (a as usize + 256) as *mut std::ffi::c_void, 1 << 20, 0);
            let s = r.statistics(0).unwrap();
            assert_eq!(
                (s.current_bytes, s.peak_bytes),
                (1 << 20, 3 << 20),
                "{what}"
            );
            assert_eq!(
                (s.current_allocations, s.peak_allocations),
                (1, 2),
                "{what}"
            );
            let ooms = u64::from(kind == ResourceKind::Pool);
            assert_eq!(
                (s.failed_allocations, s.out_of_memory_failures),
                (ooms, ooms),
                "{what}"
            );
            assert!(s.pool_size >= 1 << 20, "{what}: {s:?}");
            assert!(s.peak_pool_size >= 3 << 20, "{what}: {s:?}");

            r.reset_peak_statistics(0).unwrap();
            let s = r.statistics(0).unwrap();
            assert_eq!(
                (s.current_bytes, s.peak_bytes),
                (1 << 20, 1 << 20),
                "{what}"
            );
            assert_eq!(
                (s.current_allocations, s.peak_allocations),
                (1, 1),
                "{what}"
            );
            assert_eq!((s.total_bytes, s.total_allocations), (3 << 20, 2), "{what}");
            assert_eq!(s.peak_pool_size, s.pool_size, "{what}: {s:?}");
            // The peaks count from the reset; a free of memory from before it lowers the
            // value below the reset's; a second reset merges the first one's frame down.
            let c = alloc(&r, 512 << 10, 0).unwrap();
            free(&r, a, 1 << 20, 0).unwrap();
            let s = r.statistics(0).unwrap();
            assert_eq!(
                (s.current_bytes, s.peak_bytes),
                (512 << 10, 3 << 19),
                "{what}"
            );
            r.reset_peak_statistics(0).unwrap();
            free(&r, c, 512 << 10, 0).unwrap();
            let s = r.statistics(0).unwrap();
            assert_eq!((s.current_bytes, s.peak_bytes), (0, 512 << 10), "{what}");
            assert_eq!(
                (s.current_allocations, s.peak_allocations),
                (0, 1),
                "{what}"
            );
            assert_eq!((s.total_bytes, s.total_allocations), (7 << 19, 3), "{what}");
            assert_eq!(s.out_of_memory_failures, ooms, "{what}");
            assert_eq!(s.outstanding_allocations, 0, "{what}");
            let _ = std::fs::remove_dir_all(&dir);
        }
        let r = Registry::new(build_on_host);
        assert_eq!(
            r.reset_peak_statistics(3).unwrap_err().code,
            crate::status::RMM_RS_ERROR_NOT_CONFIGURED
        );
        assert_eq!(
            r.reset_peak_statistics(-1).unwrap_err().code,
            RMM_RS_ERROR_INVALID_ARGUMENT
        );
    }

    #[test]
    fn snapshots_are_written_where_the_stack_keeps_blocks() {
        let dir = std::env::temp_dir().join(format!("rmm-capi-snap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("snapshot.pickle");
        let r = Registry::new(build_on_host);
        assert_eq!(
            r.dump_snapshot(0, &path).unwrap_err().code,
            crate::status::RMM_RS_ERROR_NOT_CONFIGURED
        );
        r.configure(every_device(Config {
            initial_pool_size: Some(0),
            ..Config::default()
        }))
        .unwrap();
        // Configured, not built: an empty snapshot, in PyTorch's format.
        r.dump_snapshot(0, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[0], 0x80, "a pickle");
        let mut empty = Vec::new();
        rmm::Snapshot::default().write_pickle(&mut empty).unwrap();
        assert_eq!(bytes, empty);
        assert_eq!(
            r.dump_snapshot(0, &dir.join("no/such/dir/s.pickle"))
                .unwrap_err()
                .code,
            RMM_RS_ERROR_INVALID_ARGUMENT
        );
        let p = alloc(&r, 1 << 20, 0).unwrap();
        // What the built stack writes is its pool's snapshot, or the pool's reason for having
        // none.
        let pool = crate::test_support::build_on_host(&Config::default(), DeviceId(0)).unwrap();
        let direct = pool.snapshot();
        let _ = std::fs::remove_file(&path);
        match (r.dump_snapshot(0, &path), direct) {
            (Ok(()), Ok(_)) => {
                let bytes = std::fs::read(&path).unwrap();
                assert_eq!(bytes[0], 0x80, "a pickle");
            }
            (Err(e), Err(why)) => {
                assert_eq!(e.code, crate::status::RMM_RS_ERROR_UNSUPPORTED, "{e}");
                assert_eq!(e.message, why.to_string());
                assert!(!path.exists());
            }
            (got, want) => panic!("dump_snapshot: {got:?}, the pool's snapshot: {want:?}"),
        }
        free(&r, p, 1 << 20, 0).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn each_device_logs_to_its_file() {
        let dir = std::env::temp_dir().join(format!("rmm-capi-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let base = dir.join("rmm_log.csv");
        let r = Registry::new(build_on_host);
        r.configure(every_device(Config {
            log_file: Some(base.clone()),
            maximum_pool_size: Some(1 << 20),
            ..Config::default()
        }))
        .unwrap();
        let p = alloc(&r, 300, 2).unwrap();
        assert!(alloc(&r, 4 << 20, 2).is_err());
        free(&r, p, 300, 2).unwrap();
        let path: PathBuf = dir.join("rmm_log.dev2.csv");
        let rows = || std::fs::read_to_string(&path).unwrap().lines().count();
        {
            // At exit, a table another thread holds is left alone rather than waited for.
            let _held = r.lock();
            r.flush_logs_if_idle();
        }
        assert!(rows() < 4, "flushed under another thread's lock");
        r.flush_logs_if_idle();
        assert_eq!(rows(), 4);
        r.flush_log(2).unwrap();
        let events = parse_log(BufReader::new(std::fs::File::open(&path).unwrap())).unwrap();
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(
            actions,
            [Action::Allocate, Action::AllocateFailure, Action::Free]
        );
        assert_eq!((events[0].pointer, events[0].size), (p as u64, 300));
        assert_eq!(events[0].stream, 1, "the legacy stream's handle");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn threads_see_reconfigurations() {
        let r = Arc::new(Registry::new(build_on_host));
        r.configure(every_device(Config::default())).unwrap();
        let worker = |r: Arc<Registry>| {
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let p = alloc(&r, 256, 4).unwrap();
                    free(&r, p, 256, 4).unwrap();
                }
                r.statistics(4).unwrap().statistics_enabled
            })
        };
        let threads: Vec<_> = (0..4).map(|_| worker(Arc::clone(&r))).collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), 1);
        }
        assert_eq!(r.statistics(4).unwrap().total_allocations, 800);
        r.configure(every_device(Config {
            statistics: false,
            ..Config::default()
        }))
        .unwrap();
        // This thread used device 4's old stack; its lookups find the new one.
        let p = alloc(&r, 256, 4).unwrap();
        free(&r, p, 256, 4).unwrap();
        assert_eq!(worker(Arc::clone(&r)).join().unwrap(), 0);
        assert_eq!(r.statistics(4).unwrap().statistics_enabled, 0);
        // Two tables on one thread do not share their stacks.
        let other = Registry::new(build_on_host);
        assert_eq!(
            alloc(&other, 256, 4).unwrap_err().code,
            RMM_RS_ERROR_NOT_CONFIGURED
        );
    }

    /// Replacing a pool gives its memory back, which synchronizes the device, and building a
    /// stack may wait for it too: the table's lock is free meanwhile (it was held across
    /// both).
    #[test]
    fn no_lock_is_held_while_configuring_synchronizes() {
        use rmm::sys::fault::{self, DriverCall, FaultScope};
        use std::cell::RefCell;
        use std::rc::Rc;

        let _scope = FaultScope::new();
        let r = Arc::new(Registry::new(
            crate::test_support::build_on_host_after_a_sync,
        ));
        r.configure(every_device(Config::default())).unwrap();
        let seen: Rc<RefCell<Vec<(&'static str, bool)>>> = Rc::default();
        let (log, table) = (Rc::clone(&seen), Arc::clone(&r));
        fault::watch(DriverCall::Synchronize, move |call| {
            log.borrow_mut()
                .push((call, table.inner.try_lock().is_err()));
        });
        // Device 0 is built on first use; its pool grows and keeps a free chunk.
        let p = alloc(&r, 1 << 20, 0).unwrap();
        free(&r, p, 1 << 20, 0).unwrap();
        assert_eq!(seen.borrow().len(), 1, "the first use's build");
        // Replaced: the pool gives its chunk back after synchronizing the device.
        r.configure(every_device(Config {
            statistics: false,
            ..Config::default()
        }))
        .unwrap();
        assert!(seen.borrow().len() >= 2, "the replaced pool's release");
        // Listed devices are built at once.
        let before = seen.borrow().len();
        r.configure(on(&[0, 1], Config::default())).unwrap();
        assert!(seen.borrow().len() >= before + 2, "the two builds");
        fault::unwatch(DriverCall::Synchronize);
        for (call, locked) in seen.borrow().iter() {
            assert!(!locked, "{call} with the table locked");
        }
        assert_eq!(r.statistics(0).unwrap().outstanding_allocations, 0);
    }

    /// While a configuration gives memory back (lock released), a call for a device it
    /// replaces waits for it to end and then sees the new configuration, never the half-done
    /// table.
    #[test]
    fn calls_wait_for_a_configuration_in_flight() {
        use rmm::sys::fault::{self, DriverCall, FaultScope};
        use std::sync::mpsc;

        let r = Registry::new(build_on_host);
        r.configure(every_device(Config::default())).unwrap();
        let p = alloc(&r, 1 << 20, 0).unwrap();
        free(&r, p, 1 << 20, 0).unwrap();
        let (in_sync_tx, in_sync_rx) = mpsc::channel::<()>();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        std::thread::scope(|sc| {
            let configuring = sc.spawn(|| {
                let _scope = FaultScope::new();
                fault::watch(DriverCall::Synchronize, move |_| {
                    let _ = in_sync_tx.send(());
                    let _ = go_rx.recv();
                });
                r.configure(every_device(Config {
                    statistics: false,
                    ..Config::default()
                }))
            });
            in_sync_rx
                .recv()
                .expect("the replaced pool never synchronized");
            let (done_tx, done_rx) = mpsc::channel();
            let table = &r;
            let caller = sc.spawn(move || {
                let r = table;
                let p = alloc(r, 256, 0).unwrap();
                let enabled = r.statistics(0).unwrap().statistics_enabled;
                free(r, p, 256, 0).unwrap();
                done_tx.send(()).unwrap();
                enabled
            });
            assert!(
                done_rx
                    .recv_timeout(std::time::Duration::from_millis(100))
                    .is_err(),
                "a call went through a configuration in flight"
            );
            go_tx.send(()).unwrap();
            drop(go_tx);
            configuring.join().unwrap().unwrap();
            assert_eq!(caller.join().unwrap(), 0, "the old configuration served");
        });
        assert_eq!(r.retired(), 1);
    }

    /// A free of memory this configuration never handed out, which the resource below would
    /// accept (`cuMemFree` frees any device allocation), is refused while nothing is
    /// outstanding: the count never goes below zero (it wrapped, and every later configuration
    /// was refused as busy).
    #[test]
    fn a_free_the_counters_never_saw_is_refused_and_nothing_wraps() {
        use crate::test_support::{build_on_shared_host, shared_host_memory};
        use rmm::DeviceMemoryResource;

        let r = Registry::new(build_on_shared_host);
        let plain = Config {
            kind: ResourceKind::Cuda,
            ..Config::default()
        };
        r.configure(every_device(plain.clone())).unwrap();
        // Device 0 built, nothing outstanding.
        let p = alloc(&r, 256, 0).unwrap();
        free(&r, p, 256, 0).unwrap();
        let memory = shared_host_memory();
        // Allocated beside the C API, from the same allocator.
        let foreign = memory.allocate(S, 512, 256).unwrap();
        let e = free(&r, foreign.as_host_ptr(), 512, 0).unwrap_err();
        assert_eq!(e.code, crate::status::RMM_RS_ERROR_INVALID_FREE, "{e}");
        assert!(
            memory.live().contains(&(foreign.addr(), 512)),
            "the refused free reached the resource"
        );
        let s = r.statistics(0).unwrap();
        assert_eq!((s.outstanding_allocations, s.failed_frees), (0, 1), "{s:?}");
        assert_eq!((s.current_allocations, s.current_bytes), (0, 0), "{s:?}");
        // Still configurable, and still counting.
        r.configure(every_device(plain)).unwrap();
        let p = alloc(&r, 256, 0).unwrap();
        assert_eq!(r.statistics(0).unwrap().outstanding_allocations, 1);
        free(&r, p, 256, 0).unwrap();
        assert_eq!(
            free(&r, p, 256, 0).unwrap_err().code,
            crate::status::RMM_RS_ERROR_INVALID_FREE
        );
        assert_eq!(r.statistics(0).unwrap().outstanding_allocations, 0);
        // SAFETY: allocated above from this resource, with this size; host memory.
        unsafe { memory.deallocate(S, foreign, 512, 256) }.unwrap();
    }

    #[test]
    fn a_panic_in_a_resource_is_caught_at_the_boundary() {
        let r = Registry::new(crate::test_support::build_panicking);
        r.configure(every_device(Config::default())).unwrap();
        let code = crate::last_error::status(|| alloc(&r, 256, 0).map(drop));
        assert_eq!(code, crate::status::RMM_RS_ERROR_PANIC);
        // The table still works after the panic.
        assert_eq!(r.statistics(0).unwrap().outstanding_allocations, 0);
    }
}
