//! Whether an owning stream is still alive, for state that callers keep per stream (the free
//! lists of rmm-mr's stream-ordered resources): a [`StreamLife`] taken while the stream is alive
//! answers later whether it has been destroyed, and [`destroyed_streams`] counts destructions,
//! so a holder of many lives rechecks them only after the count moved.
//!
//! A [`StreamLife`] can also *pin* its stream ([`StreamLife::pin`]) while it is alive: while a
//! [`StreamPin`] is held the stream is not destroyed, so another thread may enqueue on it, e.g.
//! record an event after the owner's work. Dropping the [`CudaStream`](crate::CudaStream) still
//! ends the stream's life at once (no new pin, [`StreamLife::is_alive`] false); the driver's
//! stream is destroyed by whichever goes last, the `CudaStream` or a pin, and only then counted
//! in [`destroyed_streams`]. Nothing waits for a pin.
//!
//! Only streams created by [`CudaStream`](crate::CudaStream) (and so by
//! [`CudaStreamPool`](crate::CudaStreamPool)) are known here. The special streams never die, and
//! a foreign stream (a view made by [`CudaStreamView::from_raw`](crate::CudaStreamView::from_raw)
//! of a handle created elsewhere) has no life: [`CudaStreamView::life`](crate::CudaStreamView::life)
//! is `None` for both.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use rmm_sys::raw::CUstream;
use rmm_sys::stream as raw;
use rmm_sys::{DeviceGuard, DeviceId};

use crate::CudaStreamView;

/// Streams destroyed so far.
static DESTROYED: AtomicU64 = AtomicU64::new(0);

/// The live owning streams, by handle (a handle is reused only after its stream was destroyed,
/// and the entry is removed before that).
fn live() -> &'static Mutex<HashMap<usize, Weak<Ident>>> {
    static LIVE: OnceLock<Mutex<HashMap<usize, Weak<Ident>>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

/// A live owning stream: its handle, `cuStreamGetId` (0 if unknown) and device. Shared by the
/// [`CudaStream`](crate::CudaStream) and its pins; the last of them to go destroys the stream.
#[derive(Debug)]
struct Ident {
    handle: usize,
    id: u64,
    device: DeviceId,
    /// Set when the `CudaStream` was dropped: no new pin, and no longer alive.
    ended: AtomicBool,
    /// Whether dropping destroys a driver stream (`false` for rmm-sys's simulated streams and
    /// the tests' made-up handles).
    destroys: bool,
}

impl Drop for Ident {
    fn drop(&mut self) {
        if self.destroys {
            // The stream's context may not be the caller's; make it current for the destroy.
            let guard = DeviceGuard::new(self.device);
            // SAFETY: the handle came from `stream_create`, and this runs once, when neither
            // its `CudaStream` (whose views borrow it) nor any pin (whose views borrow the pin)
            // is left.
            let r = unsafe { raw::stream_destroy(self.handle as CUstream) };
            drop(guard);
            if let Err(e) = r {
                log::error!("rmm: failed to destroy stream {:#x}: {e}", self.handle);
            }
        }
        // Dead first (`ended` was set, or nothing references the stream any more), then
        // counted: whoever sees the new count sees the life gone.
        DESTROYED.fetch_add(1, Ordering::Release);
    }
}

/// The liveness of one owning stream. Cheap to clone; holding it keeps nothing alive.
///
/// Whether an owning stream is still alive, for state that callers keep per stream (the free
/// lists of rmm-mr's stream-ordered resources): a [`StreamLife`] taken while the stream is alive
/// answers later whether it has been destroyed, and [`destroyed_streams`] counts destructions,
/// so a holder of many lives rechecks them only after the count moved.
///
/// A [`StreamLife`] can also *pin* its stream ([`StreamLife::pin`]) while it is alive: while a
/// [`StreamPin`] is held the stream is not destroyed, so another thread may enqueue on it, e.g.
/// record an event after the owner's work. Dropping the [`CudaStream`](crate::CudaStream) still
/// ends the stream's life at once (no new pin, [`StreamLife::is_alive`] false); the driver's
/// stream is destroyed by whichever goes last, the `CudaStream` or a pin, and only then counted
/// in [`destroyed_streams`]. Nothing waits for a pin.
///
/// Only streams created by [`CudaStream`](crate::CudaStream) (and so by
/// [`CudaStreamPool`](crate::CudaStreamPool)) are known here. The special streams never die, and
/// a foreign stream (a view made by [`CudaStreamView::from_raw`](crate::CudaStreamView::from_raw)
/// of a handle created elsewhere) has no life: [`CudaStreamView::life`](crate::CudaStreamView::life)
/// is `None` for both.
#[derive(Debug, Clone)]
pub struct StreamLife(Weak<Ident>);

impl StreamLife {
    /// `false` once its [`CudaStream`](crate::CudaStream) was dropped (the driver's stream may
    /// still wait for a [`StreamPin`] to go before it is destroyed).
    #[must_use]
    pub fn is_alive(&self) -> bool {
        self.0
            .upgrade()
            .is_some_and(|ident| !ident.ended.load(Ordering::Acquire))
    }

    /// Keeps the stream from being destroyed until the pin is dropped, if it is still alive
    /// (`None` once its [`CudaStream`](crate::CudaStream) was dropped). A few atomic
    /// operations. A pin held when the `CudaStream` is dropped delays the stream's destruction
    /// (not its death) until the pin goes: hold pins briefly.
    #[must_use]
    pub fn pin(&self) -> Option<StreamPin> {
        self.0
            .upgrade()
            .filter(|ident| !ident.ended.load(Ordering::Acquire))
            .map(StreamPin)
    }
}

/// A live owning stream that cannot be destroyed while this is held ([`StreamLife::pin`]).
///
/// Its views borrow the pin, so none outlives it:
///
/// ```compile_fail,E0505
/// use rmm_stream::CudaStream;
///
/// let stream = CudaStream::non_blocking().unwrap();
/// let pin = stream.view().life().unwrap().pin().unwrap();
/// let view = pin.view();
/// drop(pin); // cannot move out of `pin` while it is borrowed
/// let _ = view.synchronize();
/// ```
#[derive(Debug)]
pub struct StreamPin(Arc<Ident>);

impl StreamPin {
    /// A view of the pinned stream, valid while the pin is borrowed.
    #[must_use]
    pub fn view(&self) -> CudaStreamView<'_> {
        // SAFETY: the stream is destroyed only when the last reference to its `Ident` goes,
        // and the pin is one (the view borrows the pin); `id` was read from this stream (or
        // is 0).
        unsafe { CudaStreamView::with_id(self.0.handle as CUstream, self.0.id) }
    }
}

impl CudaStreamView<'_> {
    /// The liveness of the stream when it is an owning [`CudaStream`](crate::CudaStream) (made
    /// by this crate): a token that says later whether the stream was destroyed. `None` for the
    /// default, legacy and per-thread streams (which never die) and for foreign streams. Takes a
    /// process-wide lock: for registration paths, not per operation. See [`StreamLife`].
    #[must_use]
    pub fn life(&self) -> Option<StreamLife> {
        life_of(self.value() as usize)
    }
}

/// How many owning streams have been destroyed in this process so far. A holder of
/// [`StreamLife`]s needs to look at them again only when this changed.
#[must_use]
pub fn destroyed_streams() -> u64 {
    DESTROYED.load(Ordering::Acquire)
}

/// What a [`CudaStream`](crate::CudaStream) holds: it registers the stream as live when made,
/// and when dropped unregisters it and lets it go (destroyed now, or by the last pin).
#[derive(Debug)]
pub(crate) struct LiveStream {
    handle: usize,
    life: Option<Arc<Ident>>,
}

impl LiveStream {
    /// Registers the stream with this handle, id (0 if unknown) and device as live; `destroys`:
    /// whether its end destroys a driver stream.
    pub(crate) fn register(handle: usize, id: u64, device: DeviceId, destroys: bool) -> Self {
        let life = Arc::new(Ident {
            handle,
            id,
            device,
            ended: AtomicBool::new(false),
            destroys,
        });
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
        // Dead now; the last reference destroys and counts the stream (`Ident::drop`): this
        // one, or a pin taken before.
        if let Some(life) = self.life.take() {
            life.ended.store(true, Ordering::Release);
        }
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
        let s = LiveStream::register(handle, 7, DeviceId(0), false);
        let life = life_of(handle).expect("registered");
        assert!(life.is_alive());
        assert!(destroyed_streams() >= before);
        drop(s);
        assert!(!life.is_alive());
        assert!(life_of(handle).is_none());
        assert!(destroyed_streams() > before);
        assert!(life.pin().is_none(), "a dead stream cannot be pinned");
        // Unknown handles have no life.
        assert!(life_of(0x1).is_none());
    }

    #[test]
    fn a_pin_names_the_stream_and_outlives_its_drop() {
        let handle = 0xfa17_0000_0000_0000 | 0x78;
        let s = LiveStream::register(handle, 42, DeviceId(0), false);
        let life = life_of(handle).expect("registered");
        let pin = life.pin().expect("alive");
        assert_eq!(pin.view().value() as usize, handle);
        assert_eq!(pin.view().id().ok(), Some(42));
        let ident = Arc::downgrade(&pin.0);
        drop(s);
        // Unregistered and dead at once; the driver's stream goes with the pin.
        assert!(life_of(handle).is_none());
        assert!(life.pin().is_none(), "no pin after the stream was dropped");
        assert!(!life.is_alive());
        assert_eq!(ident.strong_count(), 1, "the pin keeps the driver's stream");
        let destroyed = destroyed_streams();
        drop(pin);
        assert_eq!(ident.strong_count(), 0);
        assert!(destroyed_streams() > destroyed);
    }
}
