//! The C API's per-device table: which configuration each device has, its built stack, and the
//! lookup every allocation makes.
//!
//! A configuration is either for every device (the template: each device builds its stack on
//! its first use) or for listed devices (built at once). Lookups are the hot path: each thread
//! caches the stacks it used with the table's generation and takes the lock only on a miss or
//! after a reconfiguration bumped the generation. A replaced stack is retired, not dropped:
//! another thread's cache may still name it for a moment, and it must never free memory under
//! an allocation made through it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rmm::{DeviceId, MrResult};

use crate::abi::RmmRsStatistics;
use crate::config::Config;
use crate::stack::{build_on_device, DeviceState};
use crate::status::{
    CResult, Error, RMM_RS_ERROR_BUSY, RMM_RS_ERROR_INVALID_FREE, RMM_RS_ERROR_NOT_CONFIGURED,
    RMM_RS_ERROR_PANIC,
};

/// Builds a device's stack from a configuration.
pub(crate) type Builder = fn(&Config, DeviceId) -> MrResult<DeviceState>;

/// Devices above this ordinal are looked up under the lock every time (no cache slot).
const MAX_CACHED_DEVICE: usize = 1024;

#[derive(Default)]
struct Inner {
    template: Option<Config>,
    explicit: HashMap<i32, Config>,
    built: HashMap<i32, Arc<DeviceState>>,
    retired: Vec<Arc<DeviceState>>,
}

impl Inner {
    fn config_of(&self, device: i32) -> Option<&Config> {
        self.explicit.get(&device).or(self.template.as_ref())
    }
}

/// The table. The entry points use [`Registry::global`]; tests make their own.
pub(crate) struct Registry {
    id: u64,
    generation: AtomicU64,
    inner: Mutex<Inner>,
    build: Builder,
}

struct Cache {
    registry: u64,
    generation: u64,
    states: Vec<Option<Arc<DeviceState>>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            registry: 0,
            generation: 0,
            states: Vec::new(),
        })
    };
}

fn invalid_device(device: i32) -> Error {
    Error::invalid_argument(format!(
        "device must be an ordinal (0 or more), not {device}"
    ))
}

impl Registry {
    /// An empty table whose devices are built with `build`.
    #[must_use]
    pub(crate) fn new(build: Builder) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(1),
            inner: Mutex::new(Inner::default()),
            build,
        }
    }

    /// The table of the C API, building stacks on the GPU.
    pub(crate) fn global() -> &'static Registry {
        static GLOBAL: OnceLock<Registry> = OnceLock::new();
        GLOBAL.get_or_init(|| Registry::new(build_on_device))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs `config` (see `rmm_rs_configure`): for every device when it lists none, else for
    /// its devices, built now. Fails with `RMM_RS_ERROR_BUSY`, changing nothing, while a stack
    /// it would replace has allocations outstanding; a device that fails to build leaves every
    /// device as it was.
    pub(crate) fn configure(&self, config: Config) -> CResult<()> {
        config.validate()?;
        let mut inner = self.lock();
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
        for (_, s) in &old {
            s.retire();
        }
        if config.devices.is_empty() {
            inner.retired.extend(old.into_iter().map(|(_, s)| s));
            inner.explicit.clear();
            inner.template = Some(config);
        } else {
            let mut fresh = Vec::with_capacity(config.devices.len());
            for &device in &config.devices {
                match (self.build)(&config, device) {
                    Ok(s) => fresh.push((device.0, Arc::new(s))),
                    Err(e) => {
                        // The old stacks gave back only free memory and still work: reinstate.
                        for (d, s) in fresh {
                            s.retire();
                            inner.retired.push(s);
                            inner.built.remove(&d);
                        }
                        inner.built.extend(old);
                        self.generation.fetch_add(1, Ordering::AcqRel);
                        return Err(Error::from(e));
                    }
                }
            }
            inner.retired.extend(old.into_iter().map(|(_, s)| s));
            for (d, s) in fresh {
                inner.explicit.insert(d, config.clone());
                inner.built.insert(d, s);
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The stack of `device`, built now from its configuration if it is not built yet and
    /// `build` says so.
    fn state_slow(&self, device: i32, build: bool) -> CResult<Arc<DeviceState>> {
        let mut inner = self.lock();
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
        let state = Arc::new((self.build)(&config, DeviceId(device))?);
        inner.built.insert(device, Arc::clone(&state));
        Ok(state)
    }

    /// Runs `f` on the stack of `device` (built on first use when `build`; else a device not
    /// built is `RMM_RS_ERROR_INVALID_FREE`, as only frees ask so). The hot path: a
    /// thread-local read and a generation check when this thread used the device since the last
    /// configuration.
    pub(crate) fn with_state<R>(
        &self,
        device: i32,
        build: bool,
        f: impl FnOnce(&DeviceState) -> R,
    ) -> CResult<R> {
        let index = usize::try_from(device).map_err(|_| invalid_device(device))?;
        let generation = self.generation.load(Ordering::Acquire);
        let mut f = Some(f);
        // The cache stays borrowed (shared) while `f` runs, so the hit costs no reference
        // count; a nested lookup from `f` only reads it too.
        let hit = CACHE.try_with(|cache| {
            let cache = cache.try_borrow().ok()?;
            if cache.registry != self.id || cache.generation != generation {
                return None;
            }
            let state = cache.states.get(index)?.as_ref()?;
            let f = f.take()?;
            Some(f(state))
        });
        if let Ok(Some(r)) = hit {
            return Ok(r);
        }
        let state = self.state_slow(device, build)?;
        if index < MAX_CACHED_DEVICE {
            let _ = CACHE.try_with(|cache| {
                if let Ok(mut cache) = cache.try_borrow_mut() {
                    if cache.registry != self.id || cache.generation != generation {
                        cache.registry = self.id;
                        cache.generation = generation;
                        cache.states.clear();
                    }
                    if cache.states.len() <= index {
                        cache.states.resize(index + 1, None);
                    }
                    cache.states[index] = Some(Arc::clone(&state));
                }
            });
        }
        let f = f
            .take()
            .ok_or_else(|| Error::new(RMM_RS_ERROR_PANIC, "lookup closure already used"))?;
        Ok(f(&state))
    }

    /// The statistics of `device`: zeros for a configured device not built yet.
    pub(crate) fn statistics(&self, device: i32) -> CResult<RmmRsStatistics> {
        if device < 0 {
            return Err(invalid_device(device));
        }
        let inner = self.lock();
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

    /// Stacks replaced so far (tests).
    #[cfg(test)]
    pub(crate) fn retired(&self) -> usize {
        self.lock().retired.len()
    }
}
