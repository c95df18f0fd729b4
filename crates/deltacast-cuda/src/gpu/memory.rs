//! A GPU's memory: device allocations and page-locked host memory mapped into the device
//! (the types in `buffer.rs`), the copies between them, and the launchers' scratch region.

use std::ffi::c_void;
use std::sync::PoisonError;

use cudarc::driver::{result as cu, sys};

use super::buffer::{DeviceBuffer, HostBuffer, Scratch};
use super::context::Gpu;
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::DevicePtr;

/// Largest download that goes through the pinned staging buffer (larger ones, rare and
/// never on a sync's path, go straight to pageable memory).
const STAGED_DOWNLOAD_MAX: usize = 4 << 20;

impl Gpu {
    /// A new device allocation of `len` bytes (contents undefined).
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        guarded(|| {
            self.bind()?;
            let ptr = if len == 0 {
                0
            } else {
                // SAFETY: plain allocation in the bound context.
                unsafe { cu::malloc_sync(len) }.map_err(drv("cuMemAlloc"))?
            };
            Ok(DeviceBuffer {
                ptr,
                len,
                ctx: self.ctx,
            })
        })
    }

    /// `len` bytes of page-locked host memory mapped into this device (zeroed): see
    /// [`HostBuffer`]. Pinning is slow (about a second per few GB) and takes host RAM that
    /// cannot be swapped; allocate once.
    pub fn alloc_pinned(&self, len: usize) -> Result<HostBuffer> {
        guarded(|| {
            self.bind()?;
            let mut buf = HostBuffer {
                host: std::ptr::null_mut(),
                dev: 0,
                len,
                ctx: self.ctx,
            };
            if len == 0 {
                return Ok(buf);
            }
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: plain allocation in the bound context; `buf` frees it (drop) from here on.
            buf.host =
                unsafe { cu::malloc_host(len, flags) }.map_err(drv("cuMemHostAlloc"))? as *mut u8;
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: `buf.host` was just allocated with DEVICEMAP in the bound context; the
            // flags argument must be 0.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, buf.host as *mut c_void, 0) }
                .result()
                .map_err(drv("cuMemHostGetDevicePointer"))?;
            buf.dev = dev;
            // The contents of a new allocation are undefined: zero them, so that the host
            // never reads uninitialised bytes.
            buf.as_mut_slice().fill(0);
            Ok(buf)
        })
    }

    /// A new zeroed allocation.
    pub fn alloc_zeroed(&self, len: usize) -> Result<DeviceBuffer> {
        let buf = self.alloc(len)?;
        // SAFETY: the whole new allocation.
        unsafe { self.memset(buf.ptr(), 0, len)? };
        Ok(buf)
    }

    /// A new allocation holding `data`.
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let buf = self.alloc(data.len())?;
        // SAFETY: the new allocation is `data.len()` bytes.
        unsafe { self.copy_to_device(buf.ptr(), data)? };
        Ok(buf)
    }

    /// Copies `data` to `dst` (synchronous with respect to the host).
    ///
    /// # Safety
    /// `dst` must be valid for `data.len()` bytes.
    pub unsafe fn copy_to_device(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if data.is_empty() {
                return Ok(());
            }
            // SAFETY: per this function's contract; a copy from pageable memory is staged
            // before the call returns, and the stream is synchronised anyway.
            unsafe { cu::memcpy_htod_async(dst, data, self.stream) }
                .map_err(drv("cuMemcpyHtoD"))?;
            self.sync()
        })
    }

    /// Copies `len` bytes at `src` back to the host (after everything enqueued before).
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes.
    pub unsafe fn download(&self, src: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        // SAFETY: per this function's contract.
        unsafe { self.download_into(src, &mut out)? };
        Ok(out)
    }

    /// Copies `out.len()` bytes at `src` into `out`.
    ///
    /// # Safety
    /// `src` must be valid for `out.len()` bytes.
    pub unsafe fn download_into(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if out.is_empty() {
                return self.sync();
            }
            if out.len() <= STAGED_DOWNLOAD_MAX {
                // SAFETY: per this function's contract.
                return unsafe { self.download_staged(src, out) };
            }
            // SAFETY: per this function's contract; synchronised before `out` is used.
            unsafe { cu::memcpy_dtoh_async(out, src, self.stream) }.map_err(drv("cuMemcpyDtoH"))?;
            self.sync()
        })
    }

    /// Copies `out.len()` bytes at `src` into `out` through this GPU's pinned staging
    /// buffer. A copy into pageable memory that waits for a long kernel holds up the pageable
    /// copies of every other stream of the context until it completes (a staged sync's trace
    /// showed its encoding waiting for the next stage's whole diff: docs/data/gpu-sync/README.md,
    /// "Figures behind the code"); one into pinned memory does not.
    ///
    /// # Safety
    /// `src` must be valid for `out.len()` bytes.
    unsafe fn download_staged(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        let mut staging = self
            .download_staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        self.grow_staging(&mut staging, len)?;
        let Some(host) = staging.as_ref() else {
            return Err(CudaError::InvalidArgument("no staging buffer".into()));
        };
        // SAFETY: `host` holds at least `len` bytes of page-locked memory; `src` per this
        // function's contract; the stream is synchronised before the host reads it.
        unsafe { sys::cuMemcpyDtoHAsync_v2(host.host_ptr() as *mut c_void, src, len, self.stream) }
            .result()
            .map_err(drv("cuMemcpyDtoH"))?;
        self.sync()?;
        out.copy_from_slice(&host.as_slice()[..len]);
        Ok(())
    }

    /// Makes the pinned staging of small downloads hold `len` bytes (up to the most a
    /// download stages), so that a sync's first downloads do not pay for page-locked
    /// allocations (and the free of the smaller buffer, which waits for the device): the
    /// constructors reserve what their first sync downloads.
    pub fn reserve_downloads(&self, len: usize) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let mut staging = self
                .download_staging
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.grow_staging(&mut staging, len.min(STAGED_DOWNLOAD_MAX))
        })
    }

    /// Replaces `staging` by a larger buffer when it holds fewer than `len` bytes.
    fn grow_staging(&self, staging: &mut Option<HostBuffer>, len: usize) -> Result<()> {
        if staging.as_ref().is_none_or(|h| h.len() < len) {
            *staging = None;
            *staging = Some(self.alloc_pinned(len.next_power_of_two().max(4096))?);
        }
        Ok(())
    }

    pub(super) fn download_typed<T: Copy + Default>(
        &self,
        src: DevicePtr,
        n: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n == 0 {
            return Ok(out);
        }
        let bytes = n * std::mem::size_of::<T>();
        if bytes <= STAGED_DOWNLOAD_MAX {
            let mut raw = vec![0u8; bytes];
            // SAFETY: callers pass buffers of `n` values of T that they allocated themselves.
            unsafe { self.download_staged(src, &mut raw)? };
            // SAFETY: T is plain old data (repr(C) structs of integers, or integers: every
            // bit pattern is a value), and `raw` holds exactly `n` of them.
            unsafe {
                std::ptr::copy_nonoverlapping(raw.as_ptr(), out.as_mut_ptr() as *mut u8, bytes)
            };
            return Ok(out);
        }
        // SAFETY: callers pass buffers of `n` values of T (plain-old-data repr(C) structs or
        // integers) that they allocated themselves.
        unsafe { cu::memcpy_dtoh_async(&mut out, src, self.stream) }
            .map_err(drv("cuMemcpyDtoH"))?;
        self.sync()?;
        Ok(out)
    }

    pub(super) fn upload_typed<T: Copy>(&self, dst: DevicePtr, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: callers pass a scratch region sized for `data`; pageable memory is staged
        // before the call returns.
        unsafe { cu::memcpy_htod_async(dst, data, self.stream) }.map_err(drv("cuMemcpyHtoD"))
    }

    /// Sets `len` bytes at `dst` to `value` (enqueued).
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes.
    pub unsafe fn memset(&self, dst: DevicePtr, value: u8, len: usize) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: per this function's contract.
            unsafe { cu::memset_d8_async(dst, value, len, self.stream) }.map_err(drv("cuMemsetD8"))
        })
    }

    /// Device-to-device copy of `len` bytes (enqueued): `cuMemcpyDtoDAsync`.
    ///
    /// # Safety
    /// Both pointers must be valid for `len` bytes.
    pub unsafe fn copy_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: per this function's contract.
            unsafe { cu::memcpy_dtod_async(dst, src, len, self.stream) }
                .map_err(drv("cuMemcpyDtoD"))
        })
    }

    /// Enqueues a copy of `len` bytes of device memory at `src` into `dst` at `offset`
    /// (`cuMemcpyDtoHAsync`, at PCIe speed: `dst` is page-locked).
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes; `dst` must not be read or written by the host
    /// until this GPU's stream is synchronised.
    pub unsafe fn copy_to_pinned(
        &self,
        dst: &HostBuffer,
        offset: usize,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if offset.checked_add(len).is_none_or(|end| end > dst.len()) {
                return Err(CudaError::InvalidArgument(format!(
                    "copy of {len} bytes at {offset} into a pinned buffer of {}",
                    dst.len()
                )));
            }
            if len == 0 {
                return Ok(());
            }
            // SAFETY: inside `dst` (checked above); `src` per this function's contract; the
            // host keeps off `dst` until the stream is synchronised (contract).
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    dst.host_ptr().add(offset) as *mut c_void,
                    src,
                    len,
                    self.stream,
                )
            }
            .result()
            .map_err(drv("cuMemcpyDtoH"))
        })
    }

    /// Enqueues a copy of `len` bytes of `src` at `offset` to device memory at `dst`
    /// (`cuMemcpyHtoDAsync`, at PCIe speed: `src` is page-locked).
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes; the host must not write `src` until this GPU's
    /// stream is synchronised.
    pub unsafe fn copy_from_pinned(
        &self,
        dst: DevicePtr,
        src: &HostBuffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if offset.checked_add(len).is_none_or(|end| end > src.len()) {
                return Err(CudaError::InvalidArgument(format!(
                    "copy of {len} bytes at {offset} out of a pinned buffer of {}",
                    src.len()
                )));
            }
            if len == 0 {
                return Ok(());
            }
            // SAFETY: inside `src` (checked above); `dst` per this function's contract.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst,
                    src.host_ptr().add(offset) as *const c_void,
                    len,
                    self.stream,
                )
            }
            .result()
            .map_err(drv("cuMemcpyHtoD"))
        })
    }

    /// A scratch region of at least `len` bytes, 256-aligned, valid until the guard drops.
    pub(super) fn scratch(
        &self,
        len: usize,
    ) -> Result<(std::sync::MutexGuard<'_, Scratch>, DevicePtr)> {
        let mut s = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        let len = len.max(256);
        if s.buf.as_ref().is_none_or(|b| b.len() < len) {
            // Whatever used the old buffer was synchronised before its guard dropped.
            s.buf = None;
            s.buf = Some(self.alloc(len.next_power_of_two())?);
        }
        let ptr = s.buf.as_ref().map(|b| b.ptr()).unwrap_or(0);
        Ok((s, ptr))
    }
}
