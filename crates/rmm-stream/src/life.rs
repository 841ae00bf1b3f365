//! Whether an owning stream is still alive, for state that callers keep per stream (the free
//! lists of rmm-mr's stream-ordered resources): a [`StreamLife`] taken while the stream is alive
//! answers later whether it has been destroyed, and [`destroyed_streams`] counts destructions,
//! so a holder of many lives rechecks them only after the count moved.
//!
//! Only streams created by [`CudaStream`](crate::CudaStream) (and so by
//! [`CudaStreamPool`](crate::CudaStreamPool)) are known here. The special streams never die, and
//! a foreign stream (a view made by [`CudaStreamView::from_raw`](crate::CudaStreamView::from_raw)
//! of a handle created elsewhere) has no life: [`CudaStreamView::life`](crate::CudaStreamView::life)
//! is `None` for both.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

/// Streams destroyed so far.
static DESTROYED: AtomicU64 = AtomicU64::new(0);

/// The live owning streams, by handle (a handle is reused only after its stream was destroyed,
/// and the entry is removed before that).
fn live() -> &'static Mutex<HashMap<usize, Weak<()>>> {
    static LIVE: OnceLock<Mutex<HashMap<usize, Weak<()>>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

/// The liveness of one owning stream (see the [module documentation](self)). Cheap to clone;
/// holding it keeps nothing alive.
#[derive(Debug, Clone)]
pub struct StreamLife(Weak<()>);

impl StreamLife {
    /// `false` once the stream has been destroyed (or is being destroyed).
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

/// How many owning streams have been destroyed in this process so far. A holder of
/// [`StreamLife`]s needs to look at them again only when this changed.
#[must_use]
pub fn destroyed_streams() -> u64 {
    DESTROYED.load(Ordering::Acquire)
}

/// What a [`CudaStream`](crate::CudaStream) holds: it registers the stream as live when made and
/// marks it dead when dropped, before the stream is destroyed.
#[derive(Debug)]
pub(crate) struct LiveStream {
    handle: usize,
    life: Option<Arc<()>>,
}

impl LiveStream {
    /// Registers the stream with this handle as live.
    pub(crate) fn register(handle: usize) -> Self {
        let life = Arc::new(());
        live()
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(handle, Arc::downgrade(&life));
        Self {
            handle,
            life: Some(life),
        }
    }
}

impl Drop for LiveStream {
    fn drop(&mut self) {
        {
            let mut map = live().lock().unwrap_or_else(PoisonError::into_inner);
            if map.get(&self.handle).is_some_and(|w| {
                self.life
                    .as_ref()
                    .is_some_and(|l| w.ptr_eq(&Arc::downgrade(l)))
            }) {
                map.remove(&self.handle);
            }
        }
        // Dead first, then counted: whoever sees the new count sees the life gone.
        drop(self.life.take());
        DESTROYED.fetch_add(1, Ordering::Release);
    }
}

/// The life of the live owning stream with this handle, if one is registered.
pub(crate) fn life_of(handle: usize) -> Option<StreamLife> {
    live()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&handle)
        .map(|w| StreamLife(w.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registered_stream_dies_when_dropped() {
        let before = destroyed_streams();
        // A handle no real stream has (tests without a GPU).
        let handle = 0xfa17_0000_0000_0000 | 0x77;
        let s = LiveStream::register(handle);
        let life = life_of(handle).expect("registered");
        assert!(life.is_alive());
        assert!(destroyed_streams() >= before);
        drop(s);
        assert!(!life.is_alive());
        assert!(life_of(handle).is_none());
        assert!(destroyed_streams() > before);
        // Unknown handles have no life.
        assert!(life_of(0x1).is_none());
    }
}
