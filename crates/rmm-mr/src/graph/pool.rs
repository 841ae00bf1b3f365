//! The graph pool: its shared state, the registries that route captured allocations and frees
//! to it, and the capture scope.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use rmm_stream::{CudaStream, CudaStreamView, Graph, StreamCapture, StreamFlags};
use rmm_sys::{CaptureMode, CaptureStatus, DeviceGuard, DevicePtr, ALLOCATION_ALIGNMENT};

use super::blocks::{FreeError, GraphBlocks, Tag};
use super::{relaxed, ACTIVE_SCOPES, FREE_GATE};
use crate::error::{InvalidFree, MrError, MrResult};
use crate::resource::SharedResource;
use crate::sync::Mutex;
use crate::util::alignment;
use crate::MAX_OVER_ALIGNMENT;

/// The default [`GraphPoolOptions::chunk_size`]: 32 MiB.
pub const DEFAULT_GRAPH_POOL_CHUNK_SIZE: usize = 32 << 20;

/// How to build a [`GraphPool`]. Built with [`new`](Self::new) (or `Default`) and the chained
/// setters; `#[non_exhaustive]`: later options do not break callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GraphPoolOptions {
    /// Bytes reserved from the upstream at construction, before any capture (default 0: the
    /// first captured allocation reserves its chunk).
    pub initial_size: usize,
    /// The least a reservation takes from the upstream when a captured allocation finds no
    /// room, a multiple of 256 (default [`DEFAULT_GRAPH_POOL_CHUNK_SIZE`]; a larger request
    /// takes what it needs).
    pub chunk_size: usize,
    /// The most bytes the pool reserves in all (default `None`: until the upstream refuses).
    /// A captured allocation that would pass it fails with [`MrError::OutOfMemory`] and the
    /// capture stays valid.
    pub maximum_size: Option<usize>,
    /// The mode of the captures [`GraphPool::capture`] begins (default
    /// [`CaptureMode::Global`], as `torch.cuda.graph`).
    pub capture_mode: CaptureMode,
}

impl GraphPoolOptions {
    /// The defaults: nothing reserved up front, 32 MiB chunks, no maximum, global captures.
    #[must_use]
    pub fn new() -> Self {
        Self {
            initial_size: 0,
            chunk_size: DEFAULT_GRAPH_POOL_CHUNK_SIZE,
            maximum_size: None,
            capture_mode: CaptureMode::Global,
        }
    }

    /// Sets [`initial_size`](Self::initial_size).
    #[must_use]
    pub fn initial_size(mut self, initial_size: usize) -> Self {
        self.initial_size = initial_size;
        self
    }

    /// Sets [`chunk_size`](Self::chunk_size).
    #[must_use]
    pub fn chunk_size(mut self, chunk_size: usize) -> Self {
        self.chunk_size = chunk_size;
        self
    }

    /// Sets [`maximum_size`](Self::maximum_size).
    #[must_use]
    pub fn maximum_size(mut self, maximum_size: usize) -> Self {
        self.maximum_size = Some(maximum_size);
        self
    }

    /// Sets [`capture_mode`](Self::capture_mode).
    #[must_use]
    pub fn capture_mode(mut self, capture_mode: CaptureMode) -> Self {
        self.capture_mode = capture_mode;
        self
    }
}

impl Default for GraphPoolOptions {
    fn default() -> Self {
        Self::new()
    }
}

/// A graph pool's state, shared by its handle, the graphs captured with it (through [`Owner`])
/// and the registries.
struct State {
    upstream: SharedResource,
    options: GraphPoolOptions,
    /// The stream reservations and releases are ordered on: never captured.
    stream: CudaStream,
    blocks: Mutex<GraphBlocks>,
    /// The handle and every graph are gone: release once no block is live.
    orphaned: AtomicBool,
    /// The chunks went back to the upstream (once).
    released: AtomicBool,
}

/// What the handle and the graphs hold: when the last one goes, the pool is orphaned.
struct Owner(Arc<State>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.orphaned.store(true, Ordering::SeqCst);
        self.0.try_release();
    }
}

/// Captures with an active scope: capture id → its pool.
static CAPTURES: RwLock<Vec<(u64, Arc<State>)>> = RwLock::new(Vec::new());
/// Chunks of live graph pools: base → (size, pool).
static CHUNKS: RwLock<BTreeMap<u64, (usize, Arc<State>)>> = RwLock::new(BTreeMap::new());

fn pool_of_capture(id: u64) -> Option<Arc<State>> {
    let captures = CAPTURES.read().unwrap_or_else(PoisonError::into_inner);
    captures
        .iter()
        .find(|(c, _)| *c == id)
        .map(|(_, s)| Arc::clone(s))
}

fn pool_of_address(addr: u64) -> Option<Arc<State>> {
    let chunks = CHUNKS.read().unwrap_or_else(PoisonError::into_inner);
    let (&base, (size, state)) = chunks.range(..=addr).next_back()?;
    (addr < base + *size as u64).then(|| Arc::clone(state))
}

impl State {
    fn allocate(self: &Arc<Self>, at: Tag, bytes: usize, alignment: usize) -> MrResult<DevicePtr> {
        let mut blocks = self.blocks.lock();
        if let Some(a) = blocks.allocate(bytes, alignment, at) {
            return Ok(DevicePtr::from_raw(a));
        }
        let need = GraphBlocks::room_for(bytes, alignment)
            .ok_or_else(|| MrError::out_of_memory(bytes, "the request overflows"))?;
        self.reserve(&mut blocks, need, bytes)?;
        blocks
            .allocate(bytes, alignment, at)
            .map(DevicePtr::from_raw)
            .ok_or_else(|| MrError::out_of_memory(bytes, "graph pool: no room after growth"))
    }

    /// Reserves a chunk of at least `need` bytes from the upstream, on the pool's own stream,
    /// with the thread in the relaxed capture mode (legal while this thread captures), and
    /// waits for it.
    fn reserve(
        self: &Arc<Self>,
        blocks: &mut GraphBlocks,
        need: usize,
        bytes: usize,
    ) -> MrResult<()> {
        let chunk = align_up_checked(need.max(self.options.chunk_size))
            .ok_or_else(|| MrError::out_of_memory(bytes, "the request overflows"))?;
        let reserved = blocks.reserved();
        let size = match self.options.maximum_size {
            Some(max) if reserved.saturating_add(chunk) > max => {
                if reserved.saturating_add(need) > max {
                    return Err(MrError::out_of_memory(
                        bytes,
                        format!(
                            "Maximum graph pool size exceeded (failed to allocate {bytes} bytes: \
                             {reserved} of {max} bytes reserved)"
                        ),
                    ));
                }
                need
            }
            _ => chunk,
        };
        let stream = self.stream.view();
        let ptr = relaxed(|| {
            let ptr = self.upstream.allocate(stream, size, ALLOCATION_ALIGNMENT)?;
            if let Err(e) = stream.synchronize() {
                // SAFETY: just allocated here with these arguments, never handed out.
                let _ = unsafe {
                    self.upstream
                        .deallocate(stream, ptr, size, ALLOCATION_ALIGNMENT)
                };
                return Err(MrError::from(e));
            }
            Ok(ptr)
        })?;
        if !ptr.is_aligned(ALLOCATION_ALIGNMENT) {
            // SAFETY: just allocated here with these arguments, never handed out.
            let _ = unsafe {
                self.upstream
                    .deallocate(stream, ptr, size, ALLOCATION_ALIGNMENT)
            };
            return Err(alignment::misaligned_upstream(
                ptr,
                ALLOCATION_ALIGNMENT,
                "graph pool",
            ));
        }
        blocks.add_chunk(ptr.addr(), size);
        // Frees of its blocks are routed from now on (lock order: blocks, then the registry).
        CHUNKS
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ptr.addr(), (size, Arc::clone(self)));
        FREE_GATE.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn free(self: &Arc<Self>, ptr: DevicePtr, bytes: usize, at: Option<Tag>) -> MrResult<()> {
        let r = self.blocks.lock().free(ptr.addr(), bytes, at);
        self.try_release();
        r.map_err(|e| MrError::InvalidFree {
            ptr,
            bytes,
            kind: match e {
                FreeError::Unknown => InvalidFree::UnknownPointer,
                FreeError::SizeMismatch { allocated } => InvalidFree::SizeMismatch { allocated },
            },
        })
    }

    /// Gives the chunks back once the pool is orphaned and no block is live (once).
    fn try_release(&self) {
        let chunks: Vec<(u64, usize)> = {
            let blocks = self.blocks.lock();
            if !self.orphaned.load(Ordering::SeqCst) || blocks.live_blocks() > 0 {
                return;
            }
            if self.released.swap(true, Ordering::SeqCst) {
                return;
            }
            blocks.chunks().collect()
        };
        {
            let mut registry = CHUNKS.write().unwrap_or_else(PoisonError::into_inner);
            let mut removed = 0;
            for (base, _) in &chunks {
                if registry.remove(base).is_some() {
                    removed += 1;
                }
            }
            FREE_GATE.fetch_sub(removed, Ordering::SeqCst);
        }
        if chunks.is_empty() {
            return;
        }
        // Launches of the graphs that used the memory may still be running on any stream.
        let synced = relaxed(|| {
            let _device = DeviceGuard::new(self.stream.device());
            rmm_sys::device_synchronize()
        });
        if let Err(e) = synced {
            log::error!("rmm: a graph pool could not synchronize before release: {e}");
        }
        let stream = self.stream.view();
        for (base, size) in chunks {
            // SAFETY: the chunk came from the upstream with these arguments; no block of it is
            // live, no graph that used it lives, and the device was synchronized.
            let r = relaxed(|| unsafe {
                self.upstream.deallocate(
                    stream,
                    DevicePtr::from_raw(base),
                    size,
                    ALLOCATION_ALIGNMENT,
                )
            });
            if let Err(e) = r {
                log::error!("rmm: a graph pool could not release a chunk: {e}");
            }
        }
    }
}

fn align_up_checked(v: usize) -> Option<usize> {
    rmm_sys::checked_align_up(v, ALLOCATION_ALIGNMENT)
}

/// Memory private to the CUDA graphs captured with it (PyTorch's `graph_pool_handle`).
///
/// While a [`CaptureScope`] of this pool is active, allocations that this crate's
/// sub-allocators receive on the captured streams come from here, and so do their frees,
/// whenever they happen. Memory is reserved from the upstream in chunks (before capture with
/// [`GraphPoolOptions::initial_size`], or during it under the relaxed capture mode on the
/// pool's own stream, which capture allows). The rules:
///
/// - A block freed inside a capture is reused only by later allocations of that capture on
///   the stream that freed it (which the capture orders after the free), until the capture
///   ends; then by any later capture with this pool.
/// - Memory of the pool is never handed to uncaptured work, so every replay of a graph finds
///   its blocks where the capture left them.
/// - Graphs captured with one pool share its memory: never run two of them concurrently (as
///   with PyTorch's shared pools).
/// - A block the graph allocated and did not free (an output) is freed as usual, outside the
///   capture; that free waits for its stream first, and the block may then serve later
///   captures.
/// - The memory goes back to the upstream when this handle (and its clones), every
///   [`Graph`](rmm_stream::Graph) and [`GraphExec`](rmm_stream::GraphExec) captured with it
///   and every block still held are gone; the device is synchronized first.
///
/// Clones share the pool. The upstream should be the resource below any adaptors whose counts
/// matter (an adaptor above the routed resource counts the graph's blocks as well as the
/// chunks).
#[derive(Clone)]
pub struct GraphPool {
    owner: Arc<Owner>,
}

impl GraphPool {
    /// A graph pool over `upstream` with the default options (nothing reserved up front).
    pub fn new(upstream: SharedResource) -> MrResult<Self> {
        Self::with_options(upstream, GraphPoolOptions::new())
    }

    /// A graph pool over `upstream` with `options`; reserves
    /// [`initial_size`](GraphPoolOptions::initial_size) bytes now. Fails with
    /// [`MrError::InvalidArgument`] for a chunk size that is not a positive multiple of 256 or
    /// an initial size over the maximum.
    pub fn with_options(upstream: SharedResource, options: GraphPoolOptions) -> MrResult<Self> {
        if options.chunk_size == 0 || options.chunk_size % ALLOCATION_ALIGNMENT != 0 {
            return Err(MrError::invalid_argument(format!(
                "graph pool chunk size must be a positive multiple of {ALLOCATION_ALIGNMENT} \
                 ({} bytes)",
                options.chunk_size
            )));
        }
        if options
            .maximum_size
            .is_some_and(|max| options.initial_size > max)
        {
            return Err(MrError::invalid_argument(
                "graph pool initial size exceeds its maximum size",
            ));
        }
        let stream = CudaStream::new(StreamFlags::NonBlocking)?;
        let state = Arc::new(State {
            upstream,
            options,
            stream,
            blocks: Mutex::new(GraphBlocks::default()),
            orphaned: AtomicBool::new(false),
            released: AtomicBool::new(false),
        });
        let pool = Self {
            owner: Arc::new(Owner(Arc::clone(&state))),
        };
        if options.initial_size > 0 {
            let mut blocks = state.blocks.lock();
            let size = align_up_checked(options.initial_size).ok_or_else(|| {
                MrError::out_of_memory(options.initial_size, "the size overflows")
            })?;
            state.reserve(&mut blocks, size, size)?;
        }
        Ok(pool)
    }

    /// Begins capturing `stream` (in the options'
    /// [`capture_mode`](GraphPoolOptions::capture_mode)) with this pool serving the capture's
    /// allocations. `stream` must be a
    /// stream of your own (the legacy default stream cannot be captured; the driver's error).
    pub fn capture<'a>(&self, stream: CudaStreamView<'a>) -> MrResult<CaptureScope<'a>> {
        // Counted before the capture begins, so that its first allocation is routed.
        ACTIVE_SCOPES.fetch_add(1, Ordering::SeqCst);
        FREE_GATE.fetch_add(1, Ordering::SeqCst);
        let capture = match StreamCapture::begin(stream, self.owner.0.options.capture_mode) {
            Ok(c) => c,
            Err(e) => {
                ACTIVE_SCOPES.fetch_sub(1, Ordering::SeqCst);
                FREE_GATE.fetch_sub(1, Ordering::SeqCst);
                return Err(e.into());
            }
        };
        let id = capture.id();
        CAPTURES
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, Arc::clone(&self.owner.0)));
        Ok(CaptureScope {
            capture: Some(capture),
            owner: Arc::clone(&self.owner),
            id,
        })
    }

    /// Bytes reserved from the upstream.
    #[must_use]
    pub fn reserved_bytes(&self) -> usize {
        self.owner.0.blocks.lock().reserved()
    }

    /// Bytes held by blocks not freed (graph outputs, and blocks of a capture in progress).
    #[must_use]
    pub fn in_use_bytes(&self) -> usize {
        self.owner.0.blocks.lock().in_use()
    }

    /// The options the pool was built with.
    #[must_use]
    pub fn options(&self) -> GraphPoolOptions {
        self.owner.0.options
    }
}

impl fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let blocks = self.owner.0.blocks.lock();
        f.debug_struct("GraphPool")
            .field("reserved", &blocks.reserved())
            .field("in_use", &blocks.in_use())
            .field("options", &self.owner.0.options)
            .finish()
    }
}

/// A capture in progress with a [`GraphPool`] serving it ([`GraphPool::capture`]).
/// [`end`](Self::end) returns the graph, which keeps the pool's memory alive; dropping the
/// scope instead ends the capture and discards what it recorded.
#[must_use = "a capture is ended (and its graph discarded) when dropped"]
pub struct CaptureScope<'a> {
    capture: Option<StreamCapture<'a>>,
    owner: Arc<Owner>,
    id: u64,
}

impl CaptureScope<'_> {
    /// The capture's id.
    #[must_use]
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Ends the capture and returns its graph, which keeps the pool alive (as does every
    /// executable graph instantiated from it). An invalidated capture is the driver's error
    /// ([`MrError::Cuda`] with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`); the stream is no
    /// longer capturing either way.
    pub fn end(mut self) -> MrResult<Graph> {
        let ended = self.capture.take().map(StreamCapture::end);
        self.finish();
        let mut graph = match ended {
            Some(r) => r?,
            None => return Err(MrError::invalid_argument("the capture already ended")),
        };
        let keep: Arc<dyn Any + Send + Sync> = Arc::new(Arc::clone(&self.owner));
        graph.keep_alive(keep);
        Ok(graph)
    }

    /// The scope is over: unroute the capture, settle what it freed, count it out (once).
    fn finish(&mut self) {
        if self.id == u64::MAX {
            return;
        }
        CAPTURES
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(c, _)| *c != self.id);
        let state = &self.owner.0;
        state.blocks.lock().settle(self.id);
        ACTIVE_SCOPES.fetch_sub(1, Ordering::SeqCst);
        FREE_GATE.fetch_sub(1, Ordering::SeqCst);
        self.id = u64::MAX;
    }
}

impl Drop for CaptureScope<'_> {
    fn drop(&mut self) {
        drop(self.capture.take());
        self.finish();
    }
}

impl fmt::Debug for CaptureScope<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaptureScope")
            .field("id", &self.id)
            .finish()
    }
}

/// The routed allocation (a scope is active): serves `stream`'s request from the pool of its
/// capture, or `None` when the stream is not in an rmm-rs capture.
#[cold]
#[inline(never)]
pub(super) fn allocate_in_capture(
    stream: CudaStreamView<'_>,
    bytes: usize,
    alignment: usize,
) -> Option<MrResult<DevicePtr>> {
    let id = stream.capture_status().ok()?.id()?;
    let state = pool_of_capture(id)?;
    Some(allocate_from(&state, stream, id, bytes, alignment))
}

fn allocate_from(
    state: &Arc<State>,
    stream: CudaStreamView<'_>,
    capture: u64,
    bytes: usize,
    alignment: usize,
) -> MrResult<DevicePtr> {
    let alignment = alignment::check(alignment, MAX_OVER_ALIGNMENT)?;
    if bytes == 0 {
        return Ok(DevicePtr::NULL);
    }
    let at = Tag {
        capture,
        stream: stream.id()?,
    };
    state.allocate(at, bytes, alignment)
}

/// The routed free (a scope is active or a pool holds memory).
///
/// # Safety
/// The `deallocate` contract for `ptr`.
#[cold]
#[inline(never)]
pub(super) unsafe fn deallocate_routed(
    stream: CudaStreamView<'_>,
    ptr: DevicePtr,
    bytes: usize,
    _alignment: usize,
) -> Option<MrResult<()>> {
    if let Some(state) = pool_of_address(ptr.addr()) {
        let at = match stream.capture_status() {
            Ok(CaptureStatus::None) | Err(_) => None,
            Ok(s) => {
                let id = s.id().unwrap_or_default();
                match pool_of_capture(id) {
                    Some(p) if Arc::ptr_eq(&p, &state) => match stream.id() {
                        Ok(sid) => Some(Tag {
                            capture: id,
                            stream: sid,
                        }),
                        Err(e) => return Some(Err(e.into())),
                    },
                    _ => {
                        return Some(Err(MrError::Capture(format!(
                            "{ptr} ({bytes} bytes) belongs to a graph pool and was freed in \
                             capture {id}, which that pool does not serve: free it outside \
                             the capture"
                        ))))
                    }
                }
            }
        };
        if at.is_none() {
            // Freed outside capture: later captures may take it, and their graphs may be
            // launched on any stream, so wait for the work on this one now.
            if let Err(e) = relaxed(|| stream.synchronize()) {
                return Some(Err(e.into()));
            }
        }
        return Some(state.free(ptr, bytes, at));
    }
    // Not a graph pool's block: only a free inside an rmm-rs capture needs a look.
    if ACTIVE_SCOPES.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let id = stream.capture_status().ok()?.id()?;
    pool_of_capture(id)?;
    Some(Err(MrError::Capture(format!(
        "{ptr} ({bytes} bytes) was allocated outside capture {id} and freed inside it: the \
         graph's replays would use it after the resource handed it out again; free it after \
         the capture ends (nothing was freed)"
    ))))
}
