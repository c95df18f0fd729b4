//! The allocations a [`Gpu`] hands out, freed on drop in the context they were made in:
//! device memory, page-locked host memory mapped into the device, and the scratch region the
//! kernel launchers lay their tables out in.
//!
//! [`Gpu`]: super::context::Gpu

use std::ffi::c_void;

use cudarc::driver::{result as cu, sys};

use super::driver::release_in;
use crate::DevicePtr;

/// A device allocation owned by this crate, freed on drop.
pub struct DeviceBuffer {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) len: usize,
    pub(super) ctx: sys::CUcontext,
}

// SAFETY: a device address and a context handle; the driver API is thread-safe.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Its device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let ptr = self.ptr;
            release_in(self.ctx, || {
                // SAFETY: `ptr` came from `malloc_sync` in this context and is freed once.
                let _ = unsafe { cu::free_sync(ptr) };
            });
        }
    }
}

/// Page-locked host memory mapped into the device's address space (`cuMemHostAlloc` with
/// `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`), zeroed, freed on drop
/// (`cuMemFreeHost`). Kernels read and write it in place over PCIe through [`HostBuffer::ptr`]
/// (zero-copy); the host reads it through [`HostBuffer::as_slice`] once the GPU's work on it
/// is complete (every method of [`Gpu`] that returns host data synchronises its stream).
///
/// [`Gpu`]: super::context::Gpu
pub struct HostBuffer {
    /// Host address (null when `len == 0`).
    pub(super) host: *mut u8,
    /// The same memory's device address (`cuMemHostGetDevicePointer`).
    pub(super) dev: sys::CUdeviceptr,
    pub(super) len: usize,
    pub(super) ctx: sys::CUcontext,
}

// SAFETY: page-locked memory owned by this value, a device address and a context handle; the
// driver API is thread-safe, and host access goes through `&self` / `&mut self`.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Its device address (what the kernels are given; under UVA it equals the host address).
    pub fn ptr(&self) -> DevicePtr {
        self.dev
    }

    /// Its host address (null when empty).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, as the host sees them. Work the GPU has enqueued on this buffer must be
    /// complete (the `unsafe` calls that hand its address to the GPU say so).
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `host` is a live allocation of `len` bytes, zeroed at allocation, owned by
        // `self`.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// The bytes, writable from the host (same condition as [`HostBuffer::as_slice`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if !self.host.is_null() {
            let host = self.host;
            release_in(self.ctx, || {
                // SAFETY: `host` came from `cuMemHostAlloc` in this context, freed once.
                let _ = unsafe { cu::free_host(host as *mut c_void) };
            });
        }
    }
}

/// A launcher's scratch allocation, grown on demand and kept for the next call.
pub(super) struct Scratch {
    pub(super) buf: Option<DeviceBuffer>,
}
