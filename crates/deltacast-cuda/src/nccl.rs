//! NCCL through a small `dlopen` wrapper: the fourteen entry points deltacast uses, resolved at run
//! time from `DELTACAST_NCCL_PATH`, else `libnccl.so.2` (inside a torch process that is torch's
//! own copy, already loaded), else `libnccl.so`. A missing library is an error, never a panic.
//!
//! Every collective is enqueued on the caller's stream; [`NcclComm::wait`] waits for a stream
//! with a timeout, polling NCCL's asynchronous error, and aborts the communicator when a peer
//! is gone, so a dead rank fails its peers instead of hanging them.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;

use cudarc::driver::{result as cu, sys};

use crate::error::{CudaError, Result};
use crate::wait::{event_done, poll, Deadline};
use crate::DevicePtr;

/// Bytes of an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

type Comm = *mut c_void;
type Status = c_int;

/// `ncclDataType_t` codes (nccl.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    U8 = 1,
    U64 = 5,
}

/// `ncclRedOp_t` codes (nccl.h).
const RED_MAX: c_int = 2;
/// `ncclInProgress`: a non-blocking call still running.
const IN_PROGRESS: Status = 7;

struct Api {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
    comm_destroy: unsafe extern "C" fn(Comm) -> Status,
    comm_abort: unsafe extern "C" fn(Comm) -> Status,
    comm_get_async_error: unsafe extern "C" fn(Comm, *mut Status) -> Status,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Status,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> Status,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> Status,
    send: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> Status,
    recv: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> Status,
    group_start: unsafe extern "C" fn() -> Status,
    group_end: unsafe extern "C" fn() -> Status,
    get_error_string: unsafe extern "C" fn(Status) -> *const c_char,
    get_version: unsafe extern "C" fn(*mut c_int) -> Status,
    _lib: libloading::Library,
}

/// The library names tried, in order.
fn candidates() -> Vec<String> {
    let mut names = Vec::new();
    if let Ok(path) = std::env::var("DELTACAST_NCCL_PATH") {
        names.push(path);
    }
    names.push("libnccl.so.2".into());
    names.push("libnccl.so".into());
    names
}

fn load() -> std::result::Result<Api, String> {
    let mut tried = Vec::new();
    for name in candidates() {
        // SAFETY: loading NCCL runs its initialisers, which are sound; the library stays
        // loaded for as long as `Api` (for the process: it lives in a static).
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return resolve(lib).map_err(|e| format!("{name}: {e}")),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(format!(
        "{} (set DELTACAST_NCCL_PATH to libnccl.so.2, e.g. the one of the nvidia-nccl wheel)",
        tried.join("; ")
    ))
}

fn resolve(lib: libloading::Library) -> std::result::Result<Api, libloading::Error> {
    // SAFETY: each symbol is looked up with the signature nccl.h gives it (NCCL 2.x ABI).
    unsafe {
        Ok(Api {
            get_unique_id: *lib.get(b"ncclGetUniqueId\0")?,
            comm_init_rank: *lib.get(b"ncclCommInitRank\0")?,
            comm_destroy: *lib.get(b"ncclCommDestroy\0")?,
            comm_abort: *lib.get(b"ncclCommAbort\0")?,
            comm_get_async_error: *lib.get(b"ncclCommGetAsyncError\0")?,
            broadcast: *lib.get(b"ncclBroadcast\0")?,
            all_reduce: *lib.get(b"ncclAllReduce\0")?,
            all_gather: *lib.get(b"ncclAllGather\0")?,
            send: *lib.get(b"ncclSend\0")?,
            recv: *lib.get(b"ncclRecv\0")?,
            group_start: *lib.get(b"ncclGroupStart\0")?,
            group_end: *lib.get(b"ncclGroupEnd\0")?,
            get_error_string: *lib.get(b"ncclGetErrorString\0")?,
            get_version: *lib.get(b"ncclGetVersion\0")?,
            _lib: lib,
        })
    }
}

fn api() -> Result<&'static Api> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| CudaError::NcclNotFound(e.clone()))
}

fn check(api: &Api, op: &'static str, status: Status) -> Result<()> {
    if status == 0 {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for every status.
    let msg = unsafe { CStr::from_ptr((api.get_error_string)(status)) }
        .to_string_lossy()
        .into_owned();
    Err(CudaError::Nccl {
        op,
        msg: format!("{msg} (status {status})"),
    })
}

/// The loaded NCCL's version, e.g. 22805 for 2.28.5.
pub fn nccl_version() -> Result<i32> {
    let api = api()?;
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check(api, "ncclGetVersion", unsafe { (api.get_version)(&mut v) })?;
    Ok(v)
}

/// A fresh unique id: made on one rank, handed to every rank out of band (the TCP
/// rendezvous, torch's store), then passed to [`NcclComm::new`].
pub fn unique_id() -> Result<[u8; UNIQUE_ID_BYTES]> {
    let api = api()?;
    let mut id = UniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    // SAFETY: writes one ncclUniqueId.
    check(api, "ncclGetUniqueId", unsafe {
        (api.get_unique_id)(&mut id)
    })?;
    Ok(id.internal.map(|c| c as u8))
}

/// A communicator of `nranks` ranks, one per process and GPU.
pub struct NcclComm {
    comm: Comm,
    rank: usize,
    nranks: usize,
    /// Set once aborted: every later call fails instead of touching a dead communicator.
    aborted: bool,
}

// SAFETY: an opaque handle; NCCL allows a communicator to be used from any one thread at a
// time, which `&mut self` on every collective guarantees.
unsafe impl Send for NcclComm {}
// SAFETY: through a shared reference only the plain fields (rank, size) are read; every call
// into NCCL takes `&mut self`.
unsafe impl Sync for NcclComm {}

impl NcclComm {
    /// Joins the communicator named by `id` as `rank` of `nranks`. Blocks until every rank has
    /// joined. The CUDA context of the GPU this rank uses must be current (the `Gpu`'s
    /// [`crate::Gpu::make_current`] does it).
    pub fn new(id: &[u8; UNIQUE_ID_BYTES], nranks: usize, rank: usize) -> Result<NcclComm> {
        if nranks == 0 || rank >= nranks || nranks > c_int::MAX as usize {
            return Err(CudaError::InvalidArgument(format!(
                "rank {rank} of {nranks}"
            )));
        }
        let api = api()?;
        let uid = UniqueId {
            internal: id.map(|b| b as c_char),
        };
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` receives the handle; the id is passed by value as nccl.h declares.
        check(api, "ncclCommInitRank", unsafe {
            (api.comm_init_rank)(&mut comm, nranks as c_int, uid, rank as c_int)
        })?;
        Ok(NcclComm {
            comm,
            rank,
            nranks,
            aborted: false,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    fn live(&self) -> Result<&'static Api> {
        if self.aborted {
            return Err(CudaError::Nccl {
                op: "communicator",
                msg: "aborted after an earlier failure; make a new one".into(),
            });
        }
        api()
    }

    /// Broadcasts `len` bytes from `root`'s `src` into every rank's `dst` (enqueued on
    /// `stream`). On the root `src` and `dst` may be the same.
    ///
    /// # Safety
    /// `src` (root) and `dst` must be device memory of this rank's GPU, valid for `len` bytes
    /// until the stream has passed the broadcast.
    pub unsafe fn broadcast(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: usize,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        let api = self.live()?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: per this function's contract.
        check(api, "ncclBroadcast", unsafe {
            (api.broadcast)(
                src as *const c_void,
                dst as *mut c_void,
                len,
                DataType::U8 as c_int,
                root as c_int,
                self.comm,
                stream as *mut c_void,
            )
        })
    }

    /// Element-wise maximum of `count` u64 at `buf` over every rank, in place (enqueued).
    ///
    /// # Safety
    /// `buf` must be device memory valid for `count` u64 until the stream has passed it.
    pub unsafe fn all_reduce_max_u64(
        &mut self,
        buf: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        let api = self.live()?;
        // SAFETY: per this function's contract.
        check(api, "ncclAllReduce", unsafe {
            (api.all_reduce)(
                buf as *const c_void,
                buf as *mut c_void,
                count,
                DataType::U64 as c_int,
                RED_MAX,
                self.comm,
                stream as *mut c_void,
            )
        })
    }

    /// Every rank's `count` u64 at `src`, side by side in rank order in every rank's `dst`
    /// (`nranks * count` u64), enqueued on `stream`: how the ranks of a gather learn each
    /// other's lengths before [`NcclComm::gather_exact`].
    ///
    /// # Safety
    /// `src` (`count` u64) and `dst` (`nranks * count` u64) must be device memory of this
    /// rank's GPU, valid until the stream has passed the call.
    pub unsafe fn all_gather_u64(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        let api = self.live()?;
        // SAFETY: per this function's contract.
        check(api, "ncclAllGather", unsafe {
            (api.all_gather)(
                src as *const c_void,
                dst as *mut c_void,
                count,
                DataType::U64 as c_int,
                self.comm,
                stream as *mut c_void,
            )
        })
    }

    /// Gathers to `root` exactly the bytes every rank holds: rank r's `lens[r]` bytes at its
    /// `src` land in `root`'s `dst` right after those of the ranks before it, by one group of
    /// point-to-point calls (the root's own part by a device copy), enqueued on `stream`. Every
    /// rank passes the same `lens` (e.g. from [`NcclComm::all_gather_u64`]); the root refuses,
    /// before any transfer, lengths whose sum does not fit `dst_len`. Ranks with nothing to
    /// send take no part.
    ///
    /// # Safety
    /// `src` must be device memory of this rank's GPU valid for `lens[rank]` bytes, and on the
    /// root `dst` for `dst_len` bytes, until the stream has passed the gather.
    pub unsafe fn gather_exact(
        &mut self,
        src: DevicePtr,
        lens: &[u64],
        dst: DevicePtr,
        dst_len: u64,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        let api = self.live()?;
        crate::protocol::check_gather(lens, self.nranks, self.rank, root, dst_len)?;
        let as_usize = |n: u64| {
            usize::try_from(n)
                .map_err(|_| CudaError::InvalidArgument(format!("gather: {n} bytes on this host")))
        };
        if self.rank != root {
            let len = as_usize(lens[self.rank])?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: per this function's contract.
            return check(api, "ncclSend", unsafe {
                (api.send)(
                    src as *const c_void,
                    len,
                    DataType::U8 as c_int,
                    root as c_int,
                    self.comm,
                    stream as *mut c_void,
                )
            });
        }
        let mut at = dst;
        let mut calls = Vec::with_capacity(self.nranks);
        for (peer, &len) in lens.iter().enumerate() {
            calls.push((peer, at, as_usize(len)?));
            at += len;
        }
        if let Some(&(_, at, len)) = calls.get(root).filter(|c| c.2 > 0) {
            // SAFETY: `src` holds `len` bytes and `at..at + len` lies in `dst` (checked above).
            unsafe { cu::memcpy_dtod_async(at, src, len, stream as sys::CUstream) }.map_err(
                |e| CudaError::Driver {
                    op: "cuMemcpyDtoDAsync",
                    msg: format!("{:?}", e.0),
                },
            )?;
        }
        // SAFETY: opens a group, closed below whatever the calls in it return.
        check(api, "ncclGroupStart", unsafe { (api.group_start)() })?;
        let mut first_err = Ok(());
        for &(peer, at, len) in &calls {
            if peer == root || len == 0 || first_err.is_err() {
                continue;
            }
            // SAFETY: `at..at + len` lies in `dst` (checked above).
            first_err = check(api, "ncclRecv", unsafe {
                (api.recv)(
                    at as *mut c_void,
                    len,
                    DataType::U8 as c_int,
                    peer as c_int,
                    self.comm,
                    stream as *mut c_void,
                )
            });
        }
        // SAFETY: closes the group opened above.
        let ended = check(api, "ncclGroupEnd", unsafe { (api.group_end)() });
        if first_err.is_err() || ended.is_err() {
            self.abort();
        }
        first_err.and(ended)
    }

    /// Waits until `event` (recorded on the stream after the collectives) has completed,
    /// polling NCCL's asynchronous error; after `timeout`, or on an error, aborts the
    /// communicator so that no rank stays blocked in it.
    pub fn wait(&mut self, event: u64, timeout: Duration, what: &'static str) -> Result<()> {
        let api = self.live()?;
        let comm = self.comm;
        let waited = poll(Deadline::after(timeout), what, || {
            if event_done(event as sys::CUevent)? {
                return Ok(true);
            }
            let mut status: Status = 0;
            // SAFETY: writes one status.
            let got = unsafe { (api.comm_get_async_error)(comm, &mut status) };
            if got != 0 || (status != 0 && status != IN_PROGRESS) {
                check(
                    api,
                    "a collective (peer failure)",
                    if got != 0 { got } else { status },
                )?;
            }
            Ok(false)
        });
        waited.inspect_err(|_| self.abort())
    }

    /// Aborts the communicator (pending collectives are cancelled on this rank).
    pub fn abort(&mut self) {
        if !self.aborted {
            if let Ok(api) = api() {
                // SAFETY: our handle, aborted once.
                unsafe { (api.comm_abort)(self.comm) };
            }
            self.aborted = true;
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if !self.aborted {
            if let Ok(api) = api() {
                // SAFETY: our handle, destroyed once.
                unsafe { (api.comm_destroy)(self.comm) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nccl_is_an_error_that_says_what_to_do() {
        // Where NCCL is installed (the GPU machines) this makes a real id; elsewhere it must be
        // an error naming the variable to set, never a panic.
        match unique_id() {
            Ok(id) => assert_eq!(id.len(), UNIQUE_ID_BYTES),
            Err(CudaError::NcclNotFound(msg)) => {
                assert!(msg.contains("libnccl.so.2"), "{msg}");
                assert!(msg.contains("DELTACAST_NCCL_PATH"), "{msg}");
                let id = [0u8; UNIQUE_ID_BYTES];
                assert!(matches!(
                    NcclComm::new(&id, 2, 0),
                    Err(CudaError::NcclNotFound(_))
                ));
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn ranks_are_checked_before_nccl_is_called() {
        let id = [0u8; UNIQUE_ID_BYTES];
        for (nranks, rank) in [(0, 0), (2, 2), (1, 5)] {
            let err = NcclComm::new(&id, nranks, rank).err().expect("refused");
            assert!(
                matches!(
                    err,
                    CudaError::InvalidArgument(_) | CudaError::NcclNotFound(_)
                ),
                "{err}"
            );
        }
    }
}
