//! Does work on a second, high-priority stream run while a long diff runs on another? The
//! staged sync encodes stage s on one `Gpu` handle while the next stage's diff runs on
//! another; this measures, on one device, how long small operations of the encoder's kind
//! take alone and during a diff: a download of 8 bytes, an upload of 8 bytes, a memset, a
//! digest of 1 MiB (kernel + download), and the same download into pinned host memory.
//!
//!   overlap_probe [GIB]        (default 2 GiB of BF16 per diff, 1 % changed)

use std::time::Instant;

use deltacast_cuda::{DiffInput, DiffOutput, DigestInput, EncodeInput, Gpu};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gib: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(2.0);
    let differ = Gpu::new(0)?;
    let encoder = Gpu::with_options(0, differ.tuning(), true)?;
    let bytes = (gib * (1u64 << 30) as f64) as usize & !15;
    let numel = bytes / 2;
    let snapshot = differ.alloc_zeroed(bytes)?;
    let current = differ.alloc_zeroed(bytes)?;
    // 1 % of the elements changed: every 100th element set to 1.
    let mut row = [0u8; 200];
    row[0] = 1;
    let pattern: Vec<u8> = row.iter().copied().cycle().take(1 << 24).collect();
    let mut at = 0;
    while at < bytes {
        let n = pattern.len().min(bytes - at);
        // SAFETY: inside `current`.
        unsafe { differ.copy_to_device(current.ptr() + at as u64, &pattern[..n])? };
        at += n;
    }
    let capacity = (numel / 50) as u64;
    let positions = differ.alloc(capacity as usize * 8)?;
    let values = differ.alloc(capacity as usize * 2)?;
    let small = encoder.alloc_zeroed(1 << 20)?;
    let pinned = encoder.alloc_pinned(8)?;
    let inputs = [DiffInput {
        snapshot: snapshot.ptr(),
        current: current.ptr(),
        numel: numel as u64,
        width: 2,
        first_index: 0,
        digest: None,
        f32_source: None,
    }];
    let out = DiffOutput {
        positions: positions.ptr(),
        new_values: values.ptr(),
        old_values: None,
        capacity,
        expected: None,
    };
    type Op<'a> = (
        &'static str,
        Box<dyn Fn() -> Result<(), Box<dyn std::error::Error>> + 'a>,
    );
    let ops: Vec<Op> = vec![
        (
            "download 8 B (pageable)",
            Box::new(|| {
                // SAFETY: inside `small`.
                unsafe { encoder.download(small.ptr(), 8)? };
                Ok(())
            }),
        ),
        (
            "upload 8 B (pageable)",
            // SAFETY: inside `small`.
            Box::new(|| {
                // SAFETY: inside `small`.
                unsafe { encoder.copy_to_device(small.ptr(), &[1u8; 8])? };
                Ok(())
            }),
        ),
        (
            "memset 1 MiB + sync",
            Box::new(|| {
                // SAFETY: inside `small`.
                unsafe { encoder.memset(small.ptr(), 0, 1 << 20)? };
                Ok(encoder.synchronize()?)
            }),
        ),
        (
            "digest 1 MiB (kernel + download)",
            Box::new(|| {
                let d = [DigestInput {
                    ptr: small.ptr(),
                    numel: 1 << 19,
                    width: 2,
                    first_index: 0,
                    slot: 0,
                    f32_source: None,
                }];
                // SAFETY: inside `small`.
                unsafe { encoder.digest(&d)? };
                Ok(())
            }),
        ),
        (
            "download 8 B (pinned)",
            Box::new(|| {
                // SAFETY: inside `small` and `pinned`.
                unsafe { encoder.copy_to_pinned(&pinned, 0, small.ptr(), 8)? };
                Ok(encoder.synchronize()?)
            }),
        ),
    ];
    // Each diff finds the same 1 %: the snapshot is zeroed first (on the diff's stream).
    let diff = || {
        // SAFETY: our buffers, sized above.
        unsafe {
            differ.memset(snapshot.ptr(), 0, bytes)?;
            differ.diff_batch(&inputs, &out)
        }
    };
    let d = diff()?;
    println!(
        "diff of {gib} GiB alone: {:.3} ms, {} changes",
        d.kernel_ms, d.found
    );
    // The encoder's own copy of the positions, to count chunks from during later diffs.
    let held = encoder.alloc(d.found as usize * 8)?;
    // SAFETY: both hold `found` positions.
    unsafe { encoder.copy_device(held.ptr(), positions.ptr(), d.found as usize * 8)? };
    encoder.synchronize()?;
    let encode = [EncodeInput {
        change_offset: 0,
        change_count: d.found,
        first_index: 0,
        numel: numel as u64,
    }];
    let count_chunks = || -> Result<(), Box<dyn std::error::Error>> {
        // SAFETY: `held` holds the positions the inputs name.
        unsafe { encoder.encode_positions(held.ptr(), &encode, 1 << 20, None, None)? };
        Ok(())
    };
    let ops: Vec<Op> = ops
        .into_iter()
        .chain(std::iter::once((
            "count chunks (encode_positions)",
            Box::new(count_chunks) as Box<dyn Fn() -> Result<(), Box<dyn std::error::Error>>>,
        )))
        .collect();
    for (name, op) in &ops {
        op()?;
        let t = Instant::now();
        for _ in 0..20 {
            op()?;
        }
        let alone = t.elapsed().as_secs_f64() * 1e3 / 20.0;
        // The same operation, once, started while a diff runs in another thread.
        let mut during = Vec::new();
        for _ in 0..5 {
            let (waited, diff_ms) = std::thread::scope(|scope| {
                let h = scope.spawn(|| diff().map(|d| d.kernel_ms).unwrap_or(-1.0));
                std::thread::sleep(std::time::Duration::from_micros(300));
                let t = Instant::now();
                let r = op();
                let waited = t.elapsed().as_secs_f64() * 1e3;
                (r.map(|_| waited), h.join().unwrap_or(-1.0))
            });
            during.push((waited?, diff_ms));
        }
        let shown: Vec<String> = during
            .iter()
            .map(|(w, d)| format!("{w:.3} (diff {d:.2})"))
            .collect();
        println!(
            "{name:<34} alone {alone:.3} ms; during a diff: {}",
            shown.join(", ")
        );
    }
    Ok(())
}
