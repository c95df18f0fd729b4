//! Bit-exact diff of a shard against its snapshot.
//!
//! Elements are compared as unsigned integers (never as floats: NaN ≠ NaN and +0 == −0 would
//! lie). The same pass refreshes the snapshot, writing only the changed elements, so a shard is
//! read once and the snapshot's unchanged cache lines stay clean.
//!
//! The diff is memory-bound: at the densities training produces (0.1 % – 25 % of elements per
//! step) almost every 64-byte block is either untouched or holds a few changes. Every kernel
//! therefore compares a whole 64-byte block at once, skips it on a zero mask, and only then
//! visits the changed elements. Kernels are picked at run time ([`DiffImpl`]): AVX-512BW +
//! VBMI2 (compress instead of a per-change loop, and no skip branch where changes are dense),
//! AVX-512BW, AVX2, or a portable word-at-a-time fallback that every other target uses.
//!
//! Large buffers are split into chunks diffed on the rayon pool, each chunk's changes appended
//! to the output in order as soon as every earlier chunk is in (see `diff_chunked`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, TryLockError};

use rayon::prelude::*;

pub use convert::{diff_f32_as_bf16, diff_f32_as_bf16_with, diff_f32_as_fp8};

mod convert;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Elements per parallel chunk. Large enough that a chunk's bookkeeping (a counter draw, a slot
/// hand-off, one append) is noise next to its 1–4 MiB of reads; small enough to balance across
/// cores and for a chunk's changes to still sit in cache when they are appended to the output.
pub const PAR_CHUNK_ELEMS: usize = 1 << 20;

/// Bytes compared per step of every kernel: one AVX-512 register, one cache line.
const BLOCK: usize = 64;

/// Bytes of input per output reservation. The kernels reserve room for the worst case of a whole
/// window (every element changed) up front, so the per-change path needs no capacity check.
const WINDOW: usize = 64 * BLOCK;

/// Extra entries reserved past the worst case, because the compress kernels store whole
/// registers (up to 8 positions, 64 value bytes) and only then advance by the real count.
const SLACK_POSITIONS: usize = 8;
const SLACK_VALUE_BYTES: usize = BLOCK;

/// The changes found in one buffer: sorted positions with their old and new bit patterns
/// (little-endian, `width` bytes each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub positions: Vec<u64>,
    pub old_values: Vec<u8>,
    pub new_values: Vec<u8>,
}

impl Changes {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn clear(&mut self) {
        self.positions.clear();
        self.old_values.clear();
        self.new_values.clear();
    }

    /// Appends one change through the checked `Vec` API; for the few elements past the last
    /// whole block, where speed does not matter.
    #[inline]
    fn push<const W: usize>(&mut self, position: u64, old: u32, new: u32) {
        self.positions.push(position);
        self.old_values.extend_from_slice(&old.to_le_bytes()[..W]);
        self.new_values.extend_from_slice(&new.to_le_bytes()[..W]);
    }

    /// Makes room for `max` more changes of `W`-byte elements (plus the compress slack) and
    /// returns raw cursors at the ends of the three vectors. Nothing may touch `self` until the
    /// tail is handed back to [`Changes::commit`].
    #[inline]
    fn reserve_tail<const W: usize>(&mut self, max: usize) -> Tail<W> {
        self.positions.reserve(max + SLACK_POSITIONS);
        self.old_values.reserve(max * W + SLACK_VALUE_BYTES);
        self.new_values.reserve(max * W + SLACK_VALUE_BYTES);
        let (p, o, n) = (
            self.positions.len(),
            self.old_values.len(),
            self.new_values.len(),
        );
        // SAFETY: each offset is the vector's length, which is within (at the end of) its
        // allocation, so `add` stays in bounds.
        unsafe {
            Tail {
                pos: self.positions.as_mut_ptr().add(p),
                old: self.old_values.as_mut_ptr().add(o),
                new: self.new_values.as_mut_ptr().add(n),
                len: 0,
                #[cfg(debug_assertions)]
                max,
            }
        }
    }

    /// Publishes the changes written through `tail`.
    ///
    /// # Safety
    /// `tail` must come from `self.reserve_tail::<W>` with no other use of `self` since, and
    /// its first `tail.len` entries must all have been written.
    #[inline]
    unsafe fn commit<const W: usize>(&mut self, tail: Tail<W>) {
        #[cfg(debug_assertions)]
        debug_assert!(tail.len <= tail.max);
        let (p, o, n) = (
            self.positions.len(),
            self.old_values.len(),
            self.new_values.len(),
        );
        // SAFETY: per this function's contract, `tail.len` entries past each old length were
        // written, and `reserve_tail` made the capacity for them.
        unsafe {
            self.positions.set_len(p + tail.len);
            self.old_values.set_len(o + tail.len * W);
            self.new_values.set_len(n + tail.len * W);
        }
    }
}

/// Raw write cursors into the spare capacity of a [`Changes`]; see [`Changes::reserve_tail`].
struct Tail<const W: usize> {
    pos: *mut u64,
    old: *mut u8,
    new: *mut u8,
    /// Changes written so far.
    len: usize,
    #[cfg(debug_assertions)]
    max: usize,
}

impl<const W: usize> Tail<W> {
    /// Writes one change.
    ///
    /// # Safety
    /// Fewer than the reserved number of changes may have been written before.
    #[inline(always)]
    unsafe fn push(&mut self, position: u64, old: u32, new: u32) {
        #[cfg(debug_assertions)]
        debug_assert!(self.len < self.max);
        // SAFETY: `len < max`, and `reserve_tail` reserved `max` positions and `max * W` value
        // bytes past the cursors; `W <= 4` so the little-endian prefix of a `u32` covers it.
        unsafe {
            self.pos.add(self.len).write(position);
            std::ptr::copy_nonoverlapping(
                old.to_le_bytes().as_ptr(),
                self.old.add(self.len * W),
                W,
            );
            std::ptr::copy_nonoverlapping(
                new.to_le_bytes().as_ptr(),
                self.new.add(self.len * W),
                W,
            );
        }
        self.len += 1;
    }
}

/// One diff kernel. All give identical results; they differ only in speed and in the CPU
/// features they need. Tests and benches force each one; production code lets
/// [`diff_and_refresh`] pick the best available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiffImpl {
    /// Portable: a block is eight `u64` XORs; changed words are walked with `trailing_zeros`.
    Scalar,
    /// AVX2: two 32-byte compares and `movemask` per block, then a per-change loop.
    Avx2,
    /// AVX-512BW: one mask compare per block, a per-change loop for the outputs, and one masked
    /// store that refreshes exactly the changed elements of the snapshot.
    Avx512,
    /// AVX-512BW + VBMI2: as `Avx512`, but the outputs of a block are written with compress
    /// instructions rather than a loop per change; wins once blocks hold several changes.
    Avx512Vbmi2,
}

impl DiffImpl {
    /// Every kernel, available here or not, slowest first.
    pub const ALL: [DiffImpl; 4] = [
        DiffImpl::Scalar,
        DiffImpl::Avx2,
        DiffImpl::Avx512,
        DiffImpl::Avx512Vbmi2,
    ];

    /// A short lowercase name, for bench ids and logs.
    pub const fn name(self) -> &'static str {
        match self {
            DiffImpl::Scalar => "scalar",
            DiffImpl::Avx2 => "avx2",
            DiffImpl::Avx512 => "avx512",
            DiffImpl::Avx512Vbmi2 => "avx512vbmi2",
        }
    }

    /// Whether this CPU can run the kernel (detected once, then cached).
    pub fn is_available(self) -> bool {
        detected().contains(&self)
    }
}

impl std::fmt::Display for DiffImpl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernels this CPU can run, slowest first. Detection runs once: `is_x86_feature_detected!`
/// is itself cached, but the list is consulted on every chunk and a `OnceLock` read is one load.
fn detected() -> &'static [DiffImpl] {
    static DETECTED: OnceLock<Vec<DiffImpl>> = OnceLock::new();
    DETECTED.get_or_init(|| {
        #[allow(unused_mut)]
        let mut found = vec![DiffImpl::Scalar];
        #[cfg(target_arch = "x86_64")]
        found.extend(x86::detect());
        found
    })
}

/// The kernels this CPU can run, slowest first; every one of them gives the same result.
pub fn available_impls() -> Vec<DiffImpl> {
    detected().to_vec()
}

/// The kernel [`diff_and_refresh`] and [`diff_serial`] use on this CPU.
pub fn best_impl() -> DiffImpl {
    static BEST: OnceLock<DiffImpl> = OnceLock::new();
    *BEST.get_or_init(|| {
        // VBMI2 ties the others where changes are sparse (all are memory-bound there) and is
        // much the fastest at 10 % (benches/diff.rs; docs/benchmarks.md, "The CPU diff against
        // a plain read"); otherwise the widest compare.
        let order = [DiffImpl::Avx512Vbmi2, DiffImpl::Avx512, DiffImpl::Avx2];
        order
            .into_iter()
            .find(|k| k.is_available())
            .unwrap_or(DiffImpl::Scalar)
    })
}

/// Checks the arguments every entry point shares. They are the caller's bookkeeping, never
/// data from outside, so a violation is a bug and panics.
fn check_args(snapshot: &[u8], current: &[u8], width: usize) {
    assert_eq!(
        snapshot.len(),
        current.len(),
        "snapshot and current differ in length"
    );
    assert!(
        matches!(width, 1 | 2 | 4),
        "unsupported element width {width}"
    );
    assert_eq!(current.len() % width, 0, "buffer is not whole elements");
}

/// Compares `current` with `snapshot` (same length, `width`-byte elements), appends every
/// changed element to `out` with its position offset by `first_index`, and copies the new
/// bits into `snapshot` for those elements only.
///
/// Buffers larger than [`PAR_CHUNK_ELEMS`] elements are split across the rayon pool.
///
/// # Panics
/// If the buffers differ in length or are not whole elements (a caller bug, not data).
pub fn diff_and_refresh(
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
) {
    diff_and_refresh_with(best_impl(), snapshot, current, width, first_index, out);
}

/// [`diff_and_refresh`] with a forced kernel, for tests and benches.
///
/// # Panics
/// As [`diff_and_refresh`], and if `kind` is not available on this CPU.
pub fn diff_and_refresh_with(
    kind: DiffImpl,
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
) {
    diff_chunked(
        kind,
        snapshot,
        current,
        width,
        first_index,
        out,
        PAR_CHUNK_ELEMS,
    );
}

/// Single-threaded diff of one piece; same contract as [`diff_and_refresh`].
pub fn diff_serial(
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
) {
    diff_serial_with(best_impl(), snapshot, current, width, first_index, out);
}

/// [`diff_serial`] with a forced kernel, for tests and benches.
///
/// # Panics
/// As [`diff_and_refresh`], and if `kind` is not available on this CPU.
pub fn diff_serial_with(
    kind: DiffImpl,
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
) {
    check_args(snapshot, current, width);
    assert!(
        kind.is_available(),
        "diff kernel {kind} is not available on this CPU"
    );
    run_kernel(kind, snapshot, current, width, first_index, out);
}

/// Dispatches on kernel and width; arguments are already checked.
fn run_kernel(
    kind: DiffImpl,
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
) {
    match kind {
        DiffImpl::Scalar => match width {
            1 => scalar::<1>(snapshot, current, first_index, out),
            2 => scalar::<2>(snapshot, current, first_index, out),
            _ => scalar::<4>(snapshot, current, first_index, out),
        },
        #[cfg(target_arch = "x86_64")]
        _ => x86::run(kind, snapshot, current, width, first_index, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only the scalar kernel is available on this target"),
    }
}

/// The parallel driver, with the chunk size as a parameter so tests can cross many chunk
/// boundaries on small buffers.
///
/// The output must come out in chunk order, and no chunk's count is known before it is diffed.
/// Writing parts and concatenating them afterwards costs a second write and read of the whole
/// output (a third of the memory traffic at 10 % density); a counting pass first would read
/// both buffers twice. Instead, workers draw chunks in order from a shared counter (rather than
/// rayon's split-in-halves, which would finish the second half long before the first), diff
/// each into a part buffer, and hand it to a per-chunk slot; whoever finds `out` free then
/// appends every part that is next in order, usually its own while it is still in cache.
/// Nobody waits: a worker that finds `out` busy goes on to its next chunk, and the one
/// appending re-checks for newly filled slots before it leaves, so no part is stranded.
fn diff_chunked(
    kind: DiffImpl,
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
    chunk_elems: usize,
) {
    check_args(snapshot, current, width);
    assert!(
        kind.is_available(),
        "diff kernel {kind} is not available on this CPU"
    );
    chunked(
        snapshot,
        width,
        first_index,
        out,
        chunk_elems,
        |snap, first_elem, first, part| {
            let start = first_elem * width;
            let cur = &current[start..start + snap.len()];
            run_kernel(kind, snap, cur, width, first, part);
        },
    );
}

/// The chunking and in-order append of [`diff_chunked`], for any per-piece kernel: `kernel`
/// gets a piece of the snapshot, the index (in elements of the snapshot) of the piece's first
/// element, the position to report for it, and the changes to append to. The converting diff
/// (`convert`) reads its source at a different stride, hence the element index, not a slice.
fn chunked<K>(
    snapshot: &mut [u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
    chunk_elems: usize,
    kernel: K,
) where
    K: Fn(&mut [u8], usize, u64, &mut Changes) + Sync,
{
    assert!(chunk_elems > 0, "chunk size must be positive");
    let chunk_bytes = chunk_elems * width;
    if snapshot.len() <= chunk_bytes {
        kernel(snapshot, 0, first_index, out);
        return;
    }
    // One lock per chunk only to hand a `&mut` piece to whichever worker draws it; each is
    // locked exactly once, so never contended.
    let pieces: Vec<Mutex<&mut [u8]>> = snapshot.chunks_mut(chunk_bytes).map(Mutex::new).collect();
    let order = InOrder::new(out, pieces.len());
    let next_chunk = AtomicUsize::new(0);
    let workers = rayon::current_num_threads().clamp(1, pieces.len());
    (0..workers).into_par_iter().for_each(|_| {
        let mut part = Changes::default();
        loop {
            let c = next_chunk.fetch_add(1, Ordering::Relaxed);
            let Some(piece) = pieces.get(c) else { break };
            let mut snap = lock(piece);
            part.clear();
            let first_elem = c * chunk_elems;
            kernel(
                &mut snap,
                first_elem,
                first_index + first_elem as u64,
                &mut part,
            );
            drop(snap);
            part = order.hand_in(c, part);
        }
    });
    order.finish();
}

/// Locks a mutex whose data stays consistent even if a holder panicked (the panic itself
/// propagates through rayon anyway).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The in-order append side of [`diff_chunked`].
struct InOrder<'a> {
    out: Mutex<&'a mut Changes>,
    /// Finished parts waiting for every earlier chunk.
    slots: Vec<Mutex<Option<Changes>>>,
    /// The chunk that goes into `out` next; written only while holding `out`.
    next: AtomicUsize,
    /// Appended parts' buffers, handed back to workers so capacity (and its page faults) is
    /// paid once per worker, not once per chunk.
    spare: Mutex<Vec<Changes>>,
}

impl<'a> InOrder<'a> {
    fn new(out: &'a mut Changes, chunks: usize) -> Self {
        InOrder {
            out: Mutex::new(out),
            slots: (0..chunks).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// Takes chunk `c`'s changes, appends whatever is ready if nobody else is appending, and
    /// returns an empty buffer for the worker's next chunk.
    fn hand_in(&self, c: usize, part: Changes) -> Changes {
        *lock(&self.slots[c]) = Some(part);
        loop {
            let mut out = match self.out.try_lock() {
                Ok(out) => out,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                // The holder re-checks the slots after releasing, so ours will not be stranded.
                Err(TryLockError::WouldBlock) => break,
            };
            self.drain(&mut out);
            drop(out);
            // A part handed in while we held `out` found it busy and left; if it is the next
            // one, nobody else will append it, so go round again.
            if !self.next_is_ready() {
                break;
            }
        }
        lock(&self.spare).pop().unwrap_or_default()
    }

    /// Appends the ready parts in order; the caller holds `out`.
    fn drain(&self, out: &mut Changes) {
        loop {
            let n = self.next.load(Ordering::Acquire);
            let Some(slot) = self.slots.get(n) else {
                return;
            };
            let Some(part) = lock(slot).take() else {
                return;
            };
            out.positions.extend_from_slice(&part.positions);
            out.old_values.extend_from_slice(&part.old_values);
            out.new_values.extend_from_slice(&part.new_values);
            self.next.store(n + 1, Ordering::Release);
            lock(&self.spare).push(part);
        }
    }

    fn next_is_ready(&self) -> bool {
        let n = self.next.load(Ordering::Acquire);
        self.slots.get(n).is_some_and(|slot| lock(slot).is_some())
    }

    /// After every worker is done: all parts must be in. Draining once more costs nothing when
    /// they are, and keeps the result right even if the hand-off had a gap.
    fn finish(self) {
        let out = self
            .out
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let next = self.next.load(Ordering::Acquire);
        debug_assert_eq!(next, self.slots.len(), "a finished part was stranded");
        for slot in &self.slots[next..] {
            let part = lock(slot)
                .take()
                .expect("every chunk was diffed before finish");
            out.positions.extend_from_slice(&part.positions);
            out.old_values.extend_from_slice(&part.old_values);
            out.new_values.extend_from_slice(&part.new_values);
        }
    }
}

/// Reads a little-endian `W`-byte element at byte offset `at`.
#[inline(always)]
fn load<const W: usize>(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b[..W].copy_from_slice(&bytes[at..at + W]);
    u32::from_le_bytes(b)
}

/// The per-element diff of `[start..]` (whole elements), through the checked `Vec` API. Used
/// for the bytes after the last whole block, shorter than one block.
fn diff_elems<const W: usize>(
    snapshot: &mut [u8],
    current: &[u8],
    start: usize,
    first_index: u64,
    out: &mut Changes,
) {
    let mut at = start;
    while at < current.len() {
        let (old, new) = (load::<W>(snapshot, at), load::<W>(current, at));
        if old != new {
            out.push::<W>(first_index + (at / W) as u64, old, new);
            snapshot[at..at + W].copy_from_slice(&new.to_le_bytes()[..W]);
        }
        at += W;
    }
}

/// The portable kernel: per 64-byte block, OR the XOR of eight `u64` words (the compiler may
/// vectorise this), skip on zero, else walk the nonzero words' changed elements with
/// `trailing_zeros` and take old and new bits straight out of the words.
fn scalar<const W: usize>(
    snapshot: &mut [u8],
    current: &[u8],
    first_index: u64,
    out: &mut Changes,
) {
    let len = current.len();
    let blocks_end = len - len % BLOCK;
    let elem_bits = 8 * W as u32;
    let elem_mask: u64 = if W == 4 {
        u32::MAX as u64
    } else {
        (1u64 << elem_bits) - 1
    };
    let mut off = 0;
    while off < blocks_end {
        let window_end = (off + WINDOW).min(blocks_end);
        let mut tail = out.reserve_tail::<W>((window_end - off) / W);
        while off < window_end {
            // Copies of the block as words: the snapshot is written below, so keep no borrow.
            let mut sw = [0u64; 8];
            let mut cw = [0u64; 8];
            for (i, (s, c)) in sw.iter_mut().zip(cw.iter_mut()).enumerate() {
                let at = off + 8 * i;
                *s = u64::from_le_bytes(snapshot[at..at + 8].try_into().expect("8 bytes"));
                *c = u64::from_le_bytes(current[at..at + 8].try_into().expect("8 bytes"));
            }
            let any = sw.iter().zip(&cw).fold(0, |acc, (s, c)| acc | (s ^ c));
            if any != 0 {
                for (i, (&a, &b)) in sw.iter().zip(&cw).enumerate() {
                    let mut x = a ^ b;
                    while x != 0 {
                        let shift = x.trailing_zeros() / elem_bits * elem_bits;
                        let old = ((a >> shift) & elem_mask) as u32;
                        let new = ((b >> shift) & elem_mask) as u32;
                        let at = off + 8 * i + (shift / 8) as usize;
                        // SAFETY: at most one push per element of this window, and the tail was
                        // reserved for every element of the window.
                        unsafe { tail.push(first_index + (at / W) as u64, old, new) };
                        // Refresh only the changed element: the only snapshot store is here.
                        snapshot[at..at + W].copy_from_slice(&new.to_le_bytes()[..W]);
                        x &= !(elem_mask << shift);
                    }
                }
            }
            off += BLOCK;
        }
        // SAFETY: the tail came from `out.reserve_tail` just above, `out` was not used since,
        // and `tail.len` counts exactly the pushes made.
        unsafe { out.commit(tail) };
    }
    diff_elems::<W>(snapshot, current, blocks_end, first_index, out);
}
