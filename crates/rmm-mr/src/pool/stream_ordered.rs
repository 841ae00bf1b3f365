//! The stream-ordered core shared by the pool and the fixed-size resource (RMM's
//! `stream_ordered_memory_resource`, the CRTP base of both), generic over the free-list type.
//!
//! # Algorithm (RMM section 2.1)
//!
//! `allocate(stream, size)`:
//! 1. best fit in this stream's own list;
//! 2. **steal** a fitting block from another stream's list (the remainder stays there), after
//!    making this stream wait for that list's pending work ([`ListState::prepare_steal`](crate::pool::stream_lists::ListState::prepare_steal));
//! 3. **merge** other lists into this one, one at a time (waiting on each), retrying after each;
//! 4. **grow**: ask the resource's `expand` for a new upstream chunk on this stream.
//!
//! `deallocate(stream, ptr, bytes)` validates the pointer against the map of handed-out
//! blocks, records the list's event when the lazy rule asks for it, and returns the block to
//! this stream's list.
//!
//! # Locks (and their order)
//!
//! - one `Mutex` per stream list: the same-stream path takes only its own list's lock;
//! - the list **registry** (`RwLock`), taken only to register a stream the first time it is
//!   used (write) and to snapshot the lists on the slow paths (read); a per-thread cache
//!   ([`cached_list`]) keeps the same-stream path away from it;
//! - the **chunk set** (`Mutex`), the growth lock: held while asking the upstream for memory,
//!   so growth is serialized and the maximum pool size is checked against a stable size;
//! - the sharded **handed-out map** (`DashMap`, one short shard lock per operation, never held
//!   across any other lock acquisition).
//!
//! Order: chunk set → registry → one list. A thread never holds two list locks at once (a
//! steal or merge locks the victim, moves the blocks out, unlocks, then locks its own list),
//! never takes the registry or the chunk set while holding a list lock, and never takes the
//! chunk set while holding the registry (growth snapshots the lists and lets the registry go
//! first). So no cycle can form.
//!
//! Blocks being moved by a merge are briefly in no list: a concurrent allocation may then grow
//! the pool instead of finding them, and [`StreamOrdered::release_unused`] sees their chunk as
//! in use. Both are conservative.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use dashmap::DashMap;
use rmm_stream::CudaStreamView;
use rmm_sys::{checked_align_up, DeviceGuard, DeviceId, DevicePtr, ALLOCATION_ALIGNMENT};

use crate::error::{InvalidFree, MrError, MrResult};
use crate::pool::stream_lists::{
    cached_list, device_synchronize, remember_list, StreamKey, StreamList,
};
use crate::resource::DeviceMemoryResource;

/// A free-list type the stream-ordered core can drive (RMM's `free_list` / the derived
/// resource's `allocate_from_block` and `free_block`). Implementations are pure bookkeeping.
pub(crate) trait FreeBlocks: Clone + Send + 'static {
    /// What a handed-out block must remember to be freed again (the pool: whether it starts an
    /// upstream chunk).
    type Tag: Copy + Send + Sync + fmt::Debug + 'static;

    /// Removes a block for a request of `size` bytes (a multiple of 256 the resource accepts)
    /// and returns its address; any remainder stays in the list. `None` when nothing fits.
    fn take(&mut self, size: usize) -> Option<(u64, Self::Tag)>;

    /// Returns a block handed out by [`take`](Self::take) with this `size` and `tag`.
    fn put(&mut self, addr: u64, size: usize, tag: Self::Tag) -> Result<(), String>;

    /// Adds a whole, fresh upstream chunk.
    fn add_chunk(&mut self, addr: u64, size: usize) -> Result<(), String>;

    /// Moves every block of `other` into `self`. On error nothing is lost: every block is in
    /// one of the two lists.
    fn absorb(&mut self, other: &mut Self) -> Result<(), String>;

    /// Whether the list holds no block.
    fn is_empty(&self) -> bool;

    /// Whether `addr` lies in a free block of this list (to tell a double free from an unknown
    /// pointer).
    fn holds(&self, addr: u64) -> bool;

    /// If the chunk `[addr, addr + size)` is one wholly free block here, removes it.
    fn remove_chunk(&mut self, addr: u64, size: usize) -> bool;
}

/// What the handed-out map remembers of a block.
#[derive(Debug, Clone, Copy)]
struct Handed<T> {
    /// The request rounded up to 256 bytes.
    size: usize,
    tag: T,
}

/// A hasher for 256-aligned addresses (splitmix64's finalizer: every output bit depends on
/// every input bit, so both dashmap's shard bits and hashbrown's bucket bits are mixed).
#[derive(Default)]
pub(crate) struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }

    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The lists a pool knows.
struct Registry<L> {
    /// Every list but the legacy one, by key.
    by_key: HashMap<StreamKey, Arc<StreamList<L>>>,
    /// Every list (the legacy one first), in creation order: the order thieves visit them.
    all: Vec<Arc<StreamList<L>>>,
    /// The first key a caller used, while it is the only one.
    first_user: Option<Arc<StreamList<L>>>,
    /// Number of keys callers have used.
    users: usize,
}

/// A list found for a stream: the legacy list is borrowed (no reference count traffic).
enum ListRef<'a, L> {
    Legacy(&'a StreamList<L>),
    Shared(Arc<StreamList<L>>),
}

impl<L> Deref for ListRef<'_, L> {
    type Target = StreamList<L>;

    fn deref(&self) -> &StreamList<L> {
        match self {
            Self::Legacy(l) => l,
            Self::Shared(l) => l,
        }
    }
}

static NEXT_POOL: AtomicU64 = AtomicU64::new(1);

/// Treats "no driver / no device" as success: without a device no stream work can be pending
/// (this is what lets host-memory tests run the release paths on machines without a GPU).
fn settle(r: MrResult<()>) -> MrResult<()> {
    match r {
        Err(e) if e.is_no_device() => Ok(()),
        other => other,
    }
}

/// The stream-ordered core: per-stream free lists, the lazy event rule, the handed-out map and
/// the set of upstream chunks. See the [module documentation](self).
pub(crate) struct StreamOrdered<L: FreeBlocks> {
    /// Process-unique number of this core (keys the per-thread list cache).
    id: u64,
    /// An empty list (cloned for every new stream).
    empty: L,
    legacy: Arc<StreamList<L>>,
    /// Whether a caller used the legacy stream (the legacy list exists from construction, to
    /// hold the initial chunk, without counting as a user).
    legacy_used: AtomicBool,
    /// Set when a second key first appears: from then on frees on ordinary streams record.
    eager: AtomicBool,
    registry: RwLock<Registry<L>>,
    handed: DashMap<u64, Handed<L::Tag>, BuildHasherDefault<AddrHasher>>,
    /// Upstream chunks by address (the growth lock).
    chunks: Mutex<BTreeMap<u64, usize>>,
    /// Sum of the chunk sizes.
    pool_size: AtomicUsize,
    /// Whether a block was ever handed out (then drop synchronizes the device first).
    used: AtomicBool,
    /// The device current at construction, if there is one.
    device: Option<DeviceId>,
}

impl<L: FreeBlocks> StreamOrdered<L> {
    /// A core without chunks; `empty` is the list every stream starts with.
    pub(crate) fn new(empty: L) -> Self {
        let legacy = Arc::new(StreamList::new(StreamKey::Legacy, empty.clone()));
        Self {
            id: NEXT_POOL.fetch_add(1, Ordering::Relaxed),
            legacy: Arc::clone(&legacy),
            legacy_used: AtomicBool::new(false),
            eager: AtomicBool::new(false),
            registry: RwLock::new(Registry {
                by_key: HashMap::new(),
                all: vec![legacy],
                first_user: None,
                users: 0,
            }),
            empty,
            handed: DashMap::default(),
            chunks: Mutex::new(BTreeMap::new()),
            pool_size: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            device: rmm_sys::current_device().ok(),
        }
    }

    /// Adds the constructor's chunk to the legacy list (RMM obtains it on the legacy stream).
    pub(crate) fn add_initial_chunk(&self, ptr: DevicePtr, size: usize) -> MrResult<()> {
        self.lock_chunks().insert(ptr.addr(), size);
        self.pool_size.fetch_add(size, Ordering::Relaxed);
        self.legacy
            .lock()
            .blocks
            .add_chunk(ptr.addr(), size)
            .map_err(|e| MrError::bad_alloc(format!("initial chunk rejected: {e}")))
    }

    /// Bytes obtained from the upstream and not given back.
    pub(crate) fn pool_size(&self) -> usize {
        self.pool_size.load(Ordering::Relaxed)
    }

    /// Number of blocks handed out and not freed.
    pub(crate) fn outstanding(&self) -> usize {
        self.handed.len()
    }

    /// Whether frees on ordinary streams record events (a second stream key was seen).
    pub(crate) fn is_eager(&self) -> bool {
        self.eager.load(Ordering::Acquire)
    }

    /// Number of stream lists (the legacy list included).
    pub(crate) fn list_count(&self) -> usize {
        self.read_registry().all.len()
    }

    fn lock_chunks(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, usize>> {
        self.chunks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn read_registry(&self) -> std::sync::RwLockReadGuard<'_, Registry<L>> {
        self.registry.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every list (a snapshot, for the slow paths).
    fn lists(&self) -> Vec<Arc<StreamList<L>>> {
        self.read_registry().all.clone()
    }

    /// The list of `stream`, registering its key on first use.
    fn list_for(&self, stream: CudaStreamView<'_>) -> MrResult<ListRef<'_, L>> {
        let key = StreamKey::of(stream)?;
        if key == StreamKey::Legacy {
            if !self.legacy_used.load(Ordering::Acquire) {
                self.register(key);
            }
            return Ok(ListRef::Legacy(&self.legacy));
        }
        if let Some(list) = cached_list::<L>(self.id, key) {
            return Ok(ListRef::Shared(list));
        }
        let list = self.register(key);
        remember_list(self.id, key, &list);
        Ok(ListRef::Shared(list))
    }

    /// Finds or creates the list of `key` and counts the key as used; the second key turns the
    /// pool eager.
    #[cold]
    fn register(&self, key: StreamKey) -> Arc<StreamList<L>> {
        let mut reg = self
            .registry
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let (list, first_use) = if key == StreamKey::Legacy {
            (
                Arc::clone(&self.legacy),
                !self.legacy_used.load(Ordering::Relaxed),
            )
        } else if let Some(list) = reg.by_key.get(&key) {
            (Arc::clone(list), false)
        } else {
            let list = Arc::new(StreamList::new(key, self.empty.clone()));
            reg.by_key.insert(key, Arc::clone(&list));
            reg.all.push(Arc::clone(&list));
            (list, true)
        };
        if first_use {
            reg.users += 1;
            if reg.users == 1 {
                reg.first_user = Some(Arc::clone(&list));
            } else if reg.users == 2 {
                // From now on blocks can change streams. Frees on ordinary streams record
                // (checked under each list's lock, so a free that already holds the first
                // list's lock finishes before the mark below, and one that comes later sees
                // `eager`). Blocks the first list got without an event need a device
                // synchronization by their first thief.
                self.eager.store(true, Ordering::SeqCst);
                if let Some(first) = reg.first_user.take() {
                    if !first.key().is_special() {
                        first.lock().needs_device_sync = true;
                    }
                }
            }
            if key == StreamKey::Legacy {
                self.legacy_used.store(true, Ordering::Release);
            }
        }
        list
    }

    /// Allocates a block of `size` bytes (a multiple of 256 the resource accepts) on `stream`;
    /// `expand(pool_size)` obtains a new upstream chunk on `stream` (called with the growth
    /// lock held) and returns it with its size.
    pub(crate) fn allocate(
        &self,
        stream: CudaStreamView<'_>,
        size: usize,
        expand: impl FnOnce(usize) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<DevicePtr> {
        let own = self.list_for(stream)?;
        let hit = own.lock().blocks.take(size);
        let (addr, tag) = match hit {
            Some(block) => block,
            None => self.allocate_slow(&own, stream, size, expand)?,
        };
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        if self.handed.insert(addr, Handed { size, tag }).is_some() {
            log::error!("rmm: stream-ordered resource handed out {addr:#x} twice");
        }
        Ok(DevicePtr::from_raw(addr))
    }

    /// Steals one fitting block from another stream's list (the remainder stays there), else
    /// merges other lists into `own` until one fits; the stream waits on each victim's event.
    fn take_from_others(
        &self,
        own: &StreamList<L>,
        stream: CudaStreamView<'_>,
        size: usize,
    ) -> MrResult<Option<(u64, L::Tag)>> {
        let others: Vec<_> = self
            .lists()
            .into_iter()
            .filter(|l| !std::ptr::eq(&**l, own))
            .collect();
        // Steal one block; the remainder stays with its stream.
        for victim in &others {
            let mut st = victim.lock();
            let Some((addr, tag)) = st.blocks.take(size) else {
                continue;
            };
            if let Err(e) = st.prepare_steal(victim.key(), stream) {
                let _ = st.blocks.put(addr, size, tag);
                return Err(e.into());
            }
            return Ok(Some((addr, tag)));
        }
        // Merge whole lists into this one, retrying after each.
        for victim in &others {
            let mut moved = {
                let mut st = victim.lock();
                if st.blocks.is_empty() {
                    continue;
                }
                st.prepare_steal(victim.key(), stream)?;
                std::mem::replace(&mut st.blocks, self.empty.clone())
            };
            let mut st = own.lock();
            st.publish(own.key(), stream, self.is_eager());
            if let Err(e) = st.blocks.absorb(&mut moved) {
                drop(st);
                if let Err(e2) = victim.lock().blocks.absorb(&mut moved) {
                    log::error!("rmm: free blocks lost while merging stream lists: {e2}");
                }
                return Err(MrError::bad_alloc(format!(
                    "inconsistent free lists while merging: {e}"
                )));
            }
            if let Some(block) = st.blocks.take(size) {
                return Ok(Some(block));
            }
        }
        Ok(None)
    }

    #[cold]
    fn allocate_slow(
        &self,
        own: &StreamList<L>,
        stream: CudaStreamView<'_>,
        size: usize,
        expand: impl FnOnce(usize) -> MrResult<(DevicePtr, usize)>,
    ) -> MrResult<(u64, L::Tag)> {
        if let Some(block) = self.take_from_others(own, stream, size)? {
            return Ok(block);
        }
        // Grow, holding the growth lock. Threads that missed together queue here; each looks
        // again once it holds the lock, so memory another one just obtained is used instead of
        // growing the pool once per waiting thread (RMM serializes everything on one mutex and
        // so never races here).
        let mut chunks = self.lock_chunks();
        if let Some(block) = own.lock().blocks.take(size) {
            return Ok(block);
        }
        if let Some(block) = self.take_from_others(own, stream, size)? {
            return Ok(block);
        }
        let (ptr, chunk_size) = {
            let (ptr, chunk_size) = expand(self.pool_size())?;
            chunks.insert(ptr.addr(), chunk_size);
            self.pool_size.fetch_add(chunk_size, Ordering::Relaxed);
            (ptr, chunk_size)
        };
        // Publish the chunk in this stream's list before letting other growers in.
        let mut st = own.lock();
        // The chunk may still be in flight on `stream` (a stream-ordered upstream): its rest
        // must not be stolen before that, so the event is recorded after it.
        st.publish(own.key(), stream, self.is_eager());
        st.blocks
            .add_chunk(ptr.addr(), chunk_size)
            .map_err(|e| MrError::bad_alloc(format!("new upstream chunk rejected: {e}")))?;
        let block = st.blocks.take(size).ok_or_else(|| {
            MrError::bad_alloc(format!(
                "a new upstream chunk of {chunk_size} bytes cannot serve {size} bytes"
            ))
        });
        drop(st);
        drop(chunks);
        block
    }

    /// Returns a block on `stream`.
    ///
    /// # Safety
    /// As [`DeviceMemoryResource::deallocate`].
    pub(crate) unsafe fn deallocate(
        &self,
        stream: CudaStreamView<'_>,
        ptr: DevicePtr,
        bytes: usize,
    ) -> MrResult<()> {
        if ptr.is_null() || bytes == 0 {
            return Ok(());
        }
        let addr = ptr.addr();
        let Some(size) = checked_align_up(bytes, ALLOCATION_ALIGNMENT) else {
            return Err(self.invalid_free(ptr, bytes));
        };
        let own = self.list_for(stream)?;
        let Some((_, handed)) = self.handed.remove_if(&addr, |_, h| h.size == size) else {
            return Err(self.invalid_free(ptr, bytes));
        };
        let mut st = own.lock();
        st.publish(own.key(), stream, self.is_eager());
        st.blocks
            .put(addr, size, handed.tag)
            .map_err(|_| MrError::InvalidFree {
                ptr,
                bytes,
                kind: InvalidFree::DoubleFree,
            })
    }

    /// Classifies a free the handed-out map rejected.
    #[cold]
    fn invalid_free(&self, ptr: DevicePtr, bytes: usize) -> MrError {
        let addr = ptr.addr();
        let allocated = self.handed.get(&addr).map(|h| h.size);
        let kind = match allocated {
            Some(allocated) => InvalidFree::SizeMismatch { allocated },
            None if self.lists().iter().any(|l| l.lock().blocks.holds(addr)) => {
                InvalidFree::DoubleFree
            }
            None => InvalidFree::UnknownPointer,
        };
        MrError::InvalidFree { ptr, bytes, kind }
    }

    /// Gives every wholly free upstream chunk back to `upstream` (after synchronizing the
    /// device, so no pending work can still use it) and returns the bytes released.
    pub(crate) fn release_unused(&self, upstream: &dyn DeviceMemoryResource) -> MrResult<usize> {
        let mut chunks = self.lock_chunks();
        let lists = self.lists();
        let mut taken = Vec::new();
        for (&addr, &size) in chunks.iter() {
            if let Some(list) = lists
                .iter()
                .find(|l| l.lock().blocks.remove_chunk(addr, size))
            {
                taken.push((Arc::clone(list), addr, size));
            }
        }
        if taken.is_empty() {
            return Ok(0);
        }
        if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
            for (list, addr, size) in taken {
                if let Err(e) = list.lock().blocks.add_chunk(addr, size) {
                    log::error!("rmm: could not return chunk {addr:#x} to its list: {e}");
                }
            }
            return Err(e);
        }
        let mut released = 0;
        let mut first_error = None;
        for (_, addr, size) in taken {
            chunks.remove(&addr);
            self.pool_size.fetch_sub(size, Ordering::Relaxed);
            released += size;
            // SAFETY: the chunk came from `upstream` with this size, is wholly free (no block of
            // it is handed out) and the device was synchronized, so no work uses it.
            let r = unsafe {
                upstream.deallocate_sync(DevicePtr::from_raw(addr), size, ALLOCATION_ALIGNMENT)
            };
            if let Err(e) = settle(r) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(released), Err)
    }

    /// Returns every upstream chunk to `upstream`, outstanding allocations or not (called when
    /// the resource is dropped). Synchronizes the device first when a block was ever handed
    /// out, so no pending work uses the memory.
    pub(crate) fn release_all(&self, upstream: &dyn DeviceMemoryResource, name: &str) {
        let outstanding = self.handed.len();
        if outstanding > 0 {
            let bytes: usize = self.handed.iter().map(|h| h.size).sum();
            log::warn!(
                "rmm: {name} dropped with {outstanding} allocations ({bytes} bytes) outstanding; \
                 their memory goes back to the upstream"
            );
        }
        let chunks = std::mem::take(&mut *self.lock_chunks());
        if chunks.is_empty() {
            return;
        }
        let _guard = self.device.and_then(|d| DeviceGuard::new(d).ok());
        if self.used.load(Ordering::Relaxed) {
            if let Err(e) = settle(device_synchronize().map_err(MrError::from)) {
                log::error!("rmm: {name} could not synchronize the device before release: {e}");
            }
        }
        for (addr, size) in chunks {
            // SAFETY: the chunk came from `upstream` with this size; the resource is being
            // dropped, and outstanding allocations in it are the caller's documented loss.
            let r = unsafe {
                upstream.deallocate_sync(DevicePtr::from_raw(addr), size, ALLOCATION_ALIGNMENT)
            };
            if let Err(e) = settle(r) {
                log::error!("rmm: {name} could not return chunk {addr:#x} ({size} bytes): {e}");
            }
        }
        self.pool_size.store(0, Ordering::Relaxed);
    }
}

impl<L: FreeBlocks> fmt::Debug for StreamOrdered<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamOrdered")
            .field("pool_size", &self.pool_size())
            .field("outstanding", &self.outstanding())
            .field("lists", &self.list_count())
            .field("eager", &self.is_eager())
            .finish()
    }
}
