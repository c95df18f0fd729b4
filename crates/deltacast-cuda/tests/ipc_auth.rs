//! On the device: while a CUDA-IPC link's root waits for its rank, a process holding the wrong
//! secret tries to join it and to obtain and open the staging's IPC handles (as a rank with
//! the wrong secret, as a rank of the old unauthenticated link, and by opening every 64 bytes
//! it received as a memory handle) and fails; the real rank then joins, and broadcasts of
//! random bytes (odd sizes, slots reused many times) and an all-reduce arrive bit-exactly
//! (the oracle: the host bytes, made again from the seed in the rank's process).
//!
//! Needs one GPU; otherwise the test prints why it is skipped and passes
//! (`DELTACAST_REQUIRE_GPU=1` turns that into a failure). The stranger and the rank are
//! processes of their own (IPC handles cannot be opened in the process that made them): this
//! binary run again, each selecting one test below by its environment variable.
#![cfg(feature = "cuda")]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use cudarc::driver::sys;
use deltacast_cuda::ipc::{generate_token, IpcComm, IpcOptions, Secret};
use deltacast_cuda::ipc_frame::{Frame, IPC_HANDLE_BYTES};
use deltacast_cuda::{CudaError, Gpu};
use deltacast_net::auth::{blocking, Link};

const STRANGER_ENV: &str = "DELTACAST_TEST_IPC_STRANGER";
const RANK_ENV: &str = "DELTACAST_TEST_IPC_AUTH_RANK";
/// Staging of the root: 3 slots of 4 KiB, so the larger broadcasts reuse each many times.
const SLOTS: u64 = 3;
const SLOT_BYTES: u64 = 4096;
/// Broadcast sizes: one byte, around a slot, several slots and an odd remainder.
const SIZES: [usize; 6] = [1, 4095, 4096, 4097, 3 * 4096 + 5, (1 << 20) + 3];

fn one_gpu() -> bool {
    let why = match Gpu::device_count() {
        Ok(n) if n >= 1 => return true,
        Ok(_) => "no GPU".to_string(),
        Err(e) => e.to_string(),
    };
    if std::env::var("DELTACAST_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("DELTACAST_REQUIRE_GPU=1 but: {why}");
    }
    eprintln!("skipping IPC authentication test: {why}");
    false
}

fn options() -> IpcOptions {
    IpcOptions {
        slots: SLOTS,
        slot_bytes: SLOT_BYTES,
        timeout: Duration::from_secs(60),
        handshake_timeout: Duration::from_secs(5),
    }
}

/// The bytes of broadcast `i` for `seed` (xorshift), made the same in both processes.
fn data(seed: u64, i: usize) -> Vec<u8> {
    let mut x = seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..SIZES[i])
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect()
}

const ROOT_WORDS: [u64; 4] = [1, 5, u64::MAX, 0];
const RANK_WORDS: [u64; 4] = [7, 2, 3, 0];

fn words_bytes(w: &[u64]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn run_child(test: &str, env: &str, value: &str) {
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(env, value)
        .status()
        .expect("child process");
    assert!(status.success(), "{test} failed: {status}");
}

#[test]
fn a_stranger_with_the_wrong_secret_opens_nothing_and_the_sync_is_bit_exact() {
    if !one_gpu() {
        return;
    }
    let address = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        format!("127.0.0.1:{}", l.local_addr().expect("address").port())
    };
    let token = generate_token().expect("token");
    let wrong = generate_token().expect("token");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as u64;
    eprintln!("seed {seed:#x}");

    let root_address = address.clone();
    let root_token = token.clone();
    let root = std::thread::spawn(move || {
        let gpu = Gpu::new(0).expect("gpu");
        gpu.make_current().expect("current");
        let secret = Secret::new(root_token).expect("secret");
        let mut comm =
            IpcComm::new(&gpu, &root_address, 2, 0, &secret, options()).expect("the root's link");
        let refused: Vec<String> = comm.refused().iter().map(|r| r.to_string()).collect();
        let stream = gpu.stream_handle();
        for (i, &n) in SIZES.iter().enumerate() {
            let src = gpu.upload(&data(seed, i)).expect("upload");
            // SAFETY: `src` holds n bytes and lives until the wait below.
            unsafe { comm.broadcast(src.ptr(), src.ptr(), n, 0, stream, Duration::from_secs(60)) }
                .expect("broadcast");
            let done = gpu.record_done().expect("record");
            comm.wait(done, Duration::from_secs(60), "a broadcast")
                .expect("wait");
        }
        let words = gpu.upload(&words_bytes(&ROOT_WORDS)).expect("upload");
        // SAFETY: 4 words.
        unsafe { comm.all_reduce_max_u64(words.ptr(), 4, stream) }.expect("all-reduce");
        // SAFETY: 32 bytes, after the all-reduce on our stream.
        let got = unsafe { gpu.download(words.ptr(), 32) }.expect("download");
        comm.leave();
        (refused, got)
    });

    // The stranger runs to its end while the root waits for its rank.
    run_child(
        "ipc_stranger_process",
        STRANGER_ENV,
        &format!("{address}|{wrong}"),
    );
    run_child(
        "ipc_auth_rank_process",
        RANK_ENV,
        &format!("{address}|{token}|{seed}"),
    );
    let (refused, words) = root.join().expect("root thread");
    for r in &refused {
        eprintln!("root: {r}");
    }
    // The stranger's three connections, each named.
    assert_eq!(refused.len(), 3, "{refused:?}");
    assert!(
        refused.iter().all(|r| r.contains("127.0.0.1:")),
        "{refused:?}"
    );
    let max: Vec<u64> = ROOT_WORDS
        .iter()
        .zip(RANK_WORDS)
        .map(|(a, b)| (*a).max(b))
        .collect();
    assert_eq!(words, words_bytes(&max));
}

/// Whether `bytes` opens as a CUDA IPC memory handle in this process (closing it if so).
fn opens_as_handle(bytes: &[u8]) -> bool {
    let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
    for (d, &s) in h.reserved.iter_mut().zip(bytes) {
        *d = s as std::ffi::c_char;
    }
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one address; the driver checks the handle it is given.
    let r = unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut ptr,
            h,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    };
    if r == sys::cudaError_enum::CUDA_SUCCESS {
        // SAFETY: opened just above.
        unsafe { sys::cuIpcCloseMemHandle(ptr) };
        return true;
    }
    false
}

/// Reads whatever the root sends until it closes (10 s at most).
fn drain(s: &mut TcpStream, into: &mut Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        into.extend_from_slice(&buf[..n]);
    }
}

/// The stranger (run by the test above as a process of its own; does nothing otherwise).
#[test]
fn ipc_stranger_process() {
    let Ok(spec) = std::env::var(STRANGER_ENV) else {
        return;
    };
    let (address, wrong) = spec.split_once('|').expect("address|secret");
    let wrong = Secret::new(wrong).expect("secret");
    let gpu = Gpu::new(0).expect("gpu");
    gpu.make_current().expect("current");

    // 1. As a rank, with the wrong secret.
    let e = IpcComm::new(&gpu, address, 2, 1, &wrong, options())
        .err()
        .expect("a rank with the wrong secret joined");
    eprintln!("stranger as a rank: {e}");
    assert!(
        matches!(&e, CudaError::Link { op: "authenticate", msg } if msg.contains("wrong shared secret")),
        "{e}"
    );

    // 2. As a rank of the old link, which said hello at once and got the handles.
    let mut received = Vec::new();
    let mut s = TcpStream::connect(address).expect("connect");
    let hello = Frame::Hello {
        rank: 1,
        nranks: 2,
        version: 2,
    };
    s.write_all(&hello.encode()).expect("old hello");
    drain(&mut s, &mut received);

    // 3. Through the handshake with the wrong secret, then a hello anyway.
    let mut s = TcpStream::connect(address).expect("connect");
    let t = Duration::from_secs(10);
    let r = blocking::client_handshake(&mut s, Some(&wrong), Link::CudaIpc, "root", t);
    assert!(r.is_err(), "the wrong secret authenticated");
    let _ = s.write_all(&hello.encode());
    drain(&mut s, &mut received);
    eprintln!("stranger: received {} bytes in all", received.len());
    assert!(
        !received.windows(4).any(|w| w == b"DCIP"),
        "the stranger received an IPC frame"
    );

    // 4. Nothing it received, at any offset, nor an all-zero handle, opens the root's memory.
    let mut tried = vec![[0u8; IPC_HANDLE_BYTES].to_vec()];
    tried.extend(received.windows(IPC_HANDLE_BYTES).map(<[u8]>::to_vec));
    for (i, h) in tried.iter().enumerate() {
        assert!(!opens_as_handle(h), "candidate {i} opened as an IPC handle");
    }
    eprintln!("stranger: {} candidate handles, none opened", tried.len());
}

/// The real rank (run by the test above as a process of its own; does nothing otherwise).
#[test]
fn ipc_auth_rank_process() {
    let Ok(spec) = std::env::var(RANK_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.split('|').collect();
    let [address, token, seed] = parts[..] else {
        panic!("bad {RANK_ENV}: {spec}");
    };
    let seed: u64 = seed.parse().expect("seed");
    let gpu = Gpu::new(0).expect("gpu");
    gpu.make_current().expect("current");
    let secret = Secret::new(token).expect("secret");
    let mut comm = IpcComm::new(&gpu, address, 2, 1, &secret, options()).expect("the rank joins");
    let stream = gpu.stream_handle();
    for (i, &n) in SIZES.iter().enumerate() {
        let dst = gpu.alloc_zeroed(n).expect("alloc");
        // SAFETY: `dst` holds n bytes and lives until the download below.
        unsafe { comm.broadcast(0, dst.ptr(), n, 0, stream, Duration::from_secs(60)) }
            .expect("broadcast");
        let done = gpu.record_done().expect("record");
        comm.wait(done, Duration::from_secs(60), "a broadcast")
            .expect("wait");
        // SAFETY: n bytes, after the broadcast's copies on our stream.
        let got = unsafe { gpu.download(dst.ptr(), n) }.expect("download");
        assert!(got == data(seed, i), "broadcast {i} ({n} bytes) differs");
    }
    let words = gpu.upload(&words_bytes(&RANK_WORDS)).expect("upload");
    // SAFETY: 4 words.
    unsafe { comm.all_reduce_max_u64(words.ptr(), 4, stream) }.expect("all-reduce");
    // SAFETY: 32 bytes, after the all-reduce.
    let got = unsafe { gpu.download(words.ptr(), 32) }.expect("download");
    let max: Vec<u64> = ROOT_WORDS
        .iter()
        .zip(RANK_WORDS)
        .map(|(a, b)| (*a).max(b))
        .collect();
    assert_eq!(got, words_bytes(&max));
    comm.leave();
    eprintln!(
        "rank: {} broadcasts and the all-reduce bit-exact",
        SIZES.len()
    );
}
