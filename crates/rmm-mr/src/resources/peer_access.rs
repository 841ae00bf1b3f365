//! Peer access to a driver pool's memory (`cuMemPoolSetAccess`): kept apart from the pool's
//! own impls.

use rmm_sys::DeviceId;

use crate::error::{MrError, MrResult};
use crate::resources::CudaAsyncMemoryResource;

impl CudaAsyncMemoryResource {
    /// Grants every device of `peers` read and write access to the pool's memory, what is
    /// allocated now and later (`cuMemPoolSetAccess`), so that kernels and copies on those
    /// devices may use it directly (over NVLink or PCIe). The pool's own device needs no grant
    /// and is skipped. RMM has no such call (rapidsai/rmm#2075); `cudaMemPoolSetAccess` on
    /// `pool_handle()` is what C++ users write.
    ///
    /// # Errors
    /// [`MrError::Unsupported`] when a peer cannot access the pool's device
    /// (`cuDeviceCanAccessPeer`); the driver's error otherwise.
    pub fn set_peer_access(&self, peers: &[DeviceId]) -> MrResult<()> {
        let device = self.device();
        let mut grant = Vec::new();
        for &peer in peers {
            if peer == device || grant.contains(&peer) {
                continue;
            }
            if !rmm_sys::ipc::can_access_peer(peer, device)? {
                return Err(MrError::Unsupported(format!(
                    "cuda_async_memory_resource: device {peer} cannot access memory of device \
                     {device} (no peer access between them)"
                )));
            }
            grant.push(peer);
        }
        if grant.is_empty() {
            return Ok(());
        }
        // SAFETY: `self` owns the pool, so it is live.
        unsafe { rmm_sys::ipc::mem_pool_set_access(self.pool_handle(), &grant) }?;
        Ok(())
    }
}
