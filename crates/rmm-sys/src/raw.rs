//! The driver's handle types, as rmm-sys's own declarations.
//!
//! Each handle is a raw pointer to an opaque struct, exactly as `cuda.h` declares it
//! (`typedef struct CUstream_st *CUstream;`), so it is ABI-identical to the same handle of any
//! other binding of the driver API. They are declared here, not re-exported from cudarc, so
//! that a new cudarc version is not a breaking change of rmm-rs's public API. A handle from
//! cudarc (or any other binding) converts with a pointer cast:
//!
//! ```
//! # fn from_other_binding(theirs: *mut std::ffi::c_void) {
//! let stream = theirs as rmm_sys::raw::CUstream;
//! # let _ = stream;
//! # }
//! ```
#![allow(non_camel_case_types)]

use std::marker::{PhantomData, PhantomPinned};

macro_rules! opaque_handles {
    ($( $(#[$meta:meta])* $handle:ident => $target:ident; )*) => {
        $(
            #[doc = concat!("The opaque driver object a [`", stringify!($handle), "`] points to.")]
            #[repr(C)]
            pub struct $target {
                _opaque: [u8; 0],
                _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
            }

            impl std::fmt::Debug for $target {
                fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str(stringify!($target))
                }
            }

            $(#[$meta])*
            pub type $handle = *mut $target;
        )*
    };
}

opaque_handles! {
    /// A stream handle (`CUstream`). Null is the legacy default stream; `0x1` and `0x2` are
    /// the special handles [`CU_STREAM_LEGACY`](crate::CU_STREAM_LEGACY) and
    /// [`CU_STREAM_PER_THREAD`](crate::CU_STREAM_PER_THREAD).
    CUstream => CUstream_st;
    /// An event handle (`CUevent`).
    CUevent => CUevent_st;
    /// A context handle (`CUcontext`).
    CUcontext => CUctx_st;
    /// A stream-ordered memory pool handle (`CUmemoryPool`).
    CUmemoryPool => CUmemPoolHandle_st;
    /// A module handle (`CUmodule`): code loaded into a context.
    CUmodule => CUmod_st;
    /// A kernel handle (`CUfunction`), a function of a loaded module.
    CUfunction => CUfunc_st;
    /// A graph handle (`CUgraph`): work recorded by a stream capture.
    CUgraph => CUgraph_st;
    /// An executable graph handle (`CUgraphExec`): an instantiated graph, launchable.
    CUgraphExec => CUgraphExec_st;
    /// A graph node handle (`CUgraphNode`).
    CUgraphNode => CUgraphNode_st;
}

/// A device address (`CUdeviceptr`): an integer, not a pointer.
pub type CUdeviceptr = u64;

/// A device ordinal as the driver's device calls take it (`CUdevice`).
pub type CUdevice = std::ffi::c_int;
