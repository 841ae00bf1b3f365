//! Small helpers shared by the resources and adaptors: the hash table of block addresses, the
//! alignment rule, the cross-thread rule of the per-thread default stream, RMM's byte-size
//! format, the per-thread counter slots, whether a host thread is still alive (and its
//! number), and a vector that only grows.

pub(crate) mod addr_table;
pub(crate) mod alignment;
pub(crate) mod append_only;
pub(crate) mod cross_thread;
pub(crate) mod format;
pub(crate) mod slots;
pub(crate) mod thread_life;
