//! Bit packing shared by the entropy-coded sections (`gaps`, `ulp`).
//!
//! Bits fill each byte from its least significant bit up and bytes follow in order, so the bits
//! from any position are one little-endian 8-byte load and a shift away: a decoder keeps up to
//! 64 bits in a register, reads a unary prefix with one `trailing_zeros` and the fields after it
//! with shifts, with no per-bit loop; a block can start at any bit.

/// Bytes a block's code words may span: more than the largest block (gaps: 49,104 bits; ulp:
/// at most 1024 · 32 bits, the all-raw size) plus the pending partial byte. A power of two, so
/// a store index is masked into range instead of bounds checked.
const SCRATCH: usize = 8192;

/// Appends a bit stream to a byte vector, one block at a time: [`BitWriter::block`] hands out
/// a [`BlockWriter`] over the vector's spare capacity (reserved for the largest block; the
/// encoders size each block before writing it), then takes the block's whole bytes into the
/// vector and keeps the last partial byte. (Written in place: a scratch buffer copied out
/// after each block cost a copy of the whole section.)
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    /// Pending bits (the low `n`, fewer than 8), not yet in `out`.
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    /// Starts a bit stream at the end of `out`.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        BitWriter { out, acc: 0, n: 0 }
    }

    /// Writes `bits` more bits with `write`. The block writer works on a fixed-size window of
    /// the vector's spare capacity and local state, so the hot loop keeps everything in
    /// registers and stores without bounds checks.
    #[inline(always)]
    pub(crate) fn block<R>(
        &mut self,
        bits: u64,
        write: impl FnOnce(&mut BlockWriter<'_>) -> R,
    ) -> R {
        debug_assert!(
            self.n as u64 + bits < 8 * SCRATCH as u64,
            "block of {bits} bits"
        );
        self.out.reserve(SCRATCH + 8);
        let len = self.out.len();
        let mut block = BlockWriter {
            // SAFETY: `len` is within the allocation (at most its capacity).
            buf: unsafe { self.out.as_mut_ptr().add(len) },
            byte: 0,
            acc: self.acc,
            n: self.n,
            _out: std::marker::PhantomData,
        };
        let result = write(&mut block);
        debug_assert_eq!(
            block.byte as u64 * 8 + block.n as u64,
            self.n as u64 + bits,
            "block size"
        );
        let (byte, acc, n) = (block.byte, block.acc, block.n);
        // Every store was at an index below `byte` (it only grows) and so unmasked when this
        // holds, and each covered the bytes up to the next store's index: all of the first
        // `byte` are written.
        assert!(byte < SCRATCH, "block larger than its size");
        // SAFETY: `byte < SCRATCH` bytes past `len` were written (above), inside the
        // `SCRATCH + 8` reserved.
        unsafe { self.out.set_len(len + byte) };
        self.acc = acc;
        self.n = n;
        result
    }

    /// Bits written since `start_byte` (a byte offset in the vector).
    pub(crate) fn bits_since(&self, start_byte: usize) -> u64 {
        (self.out.len() - start_byte) as u64 * 8 + self.n as u64
    }

    /// Ends the stream: appends the last partial byte (zero padded).
    pub(crate) fn finish(self) {
        if self.n > 0 {
            self.out.push(self.acc as u8);
        }
    }
}

/// Writes the code words of one block: every field is one unaligned 8-byte store of the
/// accumulator, with no branch per byte.
pub(crate) struct BlockWriter<'b> {
    /// `SCRATCH + 8` bytes of spare capacity of the [`BitWriter`]'s vector, borrowed.
    buf: *mut u8,
    /// Byte of `buf` that holds the first bit not yet final.
    byte: usize,
    /// Pending bits (the low `n`, fewer than 8), already stored at `buf[byte]`.
    acc: u64,
    n: u32,
    _out: std::marker::PhantomData<&'b mut Vec<u8>>,
}

impl BlockWriter<'_> {
    /// Appends the low `len` bits of `bits` (`len <= 56`; higher bits must be zero).
    #[inline(always)]
    pub(crate) fn put(&mut self, bits: u64, len: u32) {
        debug_assert!(len <= 56, "field of {len} bits");
        debug_assert!(bits >> len == 0, "bits above the field");
        debug_assert!(self.byte < SCRATCH, "block larger than its size");
        self.acc |= bits << self.n;
        self.n += len;
        // The mask only keeps the index provably in range (the block was sized to fit), so
        // the store needs no bounds check.
        let at = self.byte & (SCRATCH - 1);
        // SAFETY: `at + 8 <= SCRATCH + 8` bytes of `buf`, reserved by `BitWriter::block` for
        // this writer's lifetime (an unaligned store to spare capacity).
        unsafe { std::ptr::write_unaligned(self.buf.add(at).cast(), self.acc.to_le_bytes()) };
        self.byte += (self.n / 8) as usize;
        // n <= 63 here, so this drops exactly the whole bytes just stored.
        self.acc >>= self.n & !7;
        self.n %= 8;
    }

    /// Appends `len` zero bits (any count).
    #[inline(always)]
    pub(crate) fn zeros(&mut self, mut len: u32) {
        while len > 56 {
            self.put(0, 56);
            len -= 56;
        }
        self.put(0, len);
    }
}

/// Values a [`Lanes`] scratch holds: the gaps and ulp blocks (1024 each).
#[cfg(target_arch = "x86_64")]
pub(crate) const LANES_MAX: usize = 1024;

/// Scratch of the lane writers (`gaps` and `ulp`) for one block: every value's code word and
/// its length, filled by a loop the compiler vectorizes, then joined by [`put_words`].
#[cfg(target_arch = "x86_64")]
pub(crate) struct Lanes {
    pub(crate) word: [u32; LANES_MAX],
    pub(crate) len: [u32; LANES_MAX],
}

#[cfg(target_arch = "x86_64")]
impl Lanes {
    pub(crate) fn new() -> Self {
        Lanes {
            word: [0; LANES_MAX],
            len: [0; LANES_MAX],
        }
    }
}

/// Eight code words joined in a vector's 64-bit lanes, as [`put_words`] writes them.
#[cfg(target_arch = "x86_64")]
pub(crate) struct Joined {
    /// Pairs: each even word, then the odd one above it.
    pub(crate) pair: std::arch::x86_64::__m256i,
    /// Each 128-bit half's two pairs, in the low 64 bits, and their lengths.
    pub(crate) quad0: std::arch::x86_64::__m128i,
    pub(crate) quad1: std::arch::x86_64::__m128i,
    pub(crate) len0: std::arch::x86_64::__m128i,
    pub(crate) len1: std::arch::x86_64::__m128i,
}

/// Joins eight code words (`w`'s u32 lanes, lengths `l`) into pairs and quads; `pair_len` is
/// each pair's length (each 64-bit lane of `l` summed: callers whose lengths are below 256
/// get it by one byte sum). A joined word longer than 64 bits is garbage (see
/// [`put_words`]).
///
/// # Safety
///
/// The CPU must have AVX2; inlined into the callers' AVX2 builds.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn join_eight(
    w: std::arch::x86_64::__m256i,
    l: std::arch::x86_64::__m256i,
    pair_len: std::arch::x86_64::__m256i,
) -> Joined {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees AVX2.
    unsafe {
        let low = _mm256_set1_epi64x(0xffff_ffff);
        let pair = _mm256_or_si256(
            _mm256_and_si256(w, low),
            _mm256_sllv_epi64(_mm256_srli_epi64::<32>(w), _mm256_and_si256(l, low)),
        );
        let quad = _mm256_or_si256(
            pair,
            _mm256_sllv_epi64(_mm256_srli_si256::<8>(pair), pair_len),
        );
        let quad_len = _mm256_add_epi64(pair_len, _mm256_srli_si256::<8>(pair_len));
        Joined {
            pair,
            quad0: _mm256_castsi256_si128(quad),
            quad1: _mm256_extracti128_si256::<1>(quad),
            len0: _mm256_castsi256_si128(quad_len),
            len1: _mm256_extracti128_si256::<1>(quad_len),
        }
    }
}

/// Writes code words given as lanes: `word[i]` of `len[i] <= 32` bits, or, for a length of 64
/// or more (a mark, `word[i]` is then ignored), whatever `general(out, i)` writes. Eight words at a time in the AVX2 build: joined
/// pairwise in the 64-bit lanes of a vector (a pair of short words always fits), then pairs of
/// pairs, then the two quads, and the octet written by one store when it has at most 56
/// bits; otherwise its quads, pairs or words one by one. A joined word longer than 64 bits is
/// never written (its shift drops bits; a shift by 64 or more gives zero), so a long value
/// marked for the general path makes its octet, quad and pair too long.
///
/// # Safety
///
/// The CPU must have the features of [`x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
pub(crate) fn put_words(
    out: &mut BlockWriter<'_>,
    word: &[u32],
    len: &[u32],
    mut general: impl FnMut(&mut BlockWriter<'_>, usize),
) {
    use std::arch::x86_64::*;
    debug_assert_eq!(word.len(), len.len());
    debug_assert!(len.iter().all(|&l| l <= 32 || l >= 64));
    let mut one = |out: &mut BlockWriter<'_>, i: usize| {
        if len[i] <= 32 {
            out.put(word[i] as u64, len[i]);
        } else {
            general(out, i);
        }
    };
    let low = _mm256_set1_epi64x(0xffff_ffff);
    let octets = word.len() / 8;
    for (o, (w, l)) in word.chunks_exact(8).zip(len.chunks_exact(8)).enumerate() {
        let (w, l): (&[u32; 8], &[u32; 8]) = (w.try_into().unwrap(), l.try_into().unwrap());
        // SAFETY: each load reads the 32 bytes of an 8-element u32 array (unaligned loads).
        let (w, l) = unsafe {
            (
                _mm256_loadu_si256(w.as_ptr().cast()),
                _mm256_loadu_si256(l.as_ptr().cast()),
            )
        };
        let pair_len = _mm256_add_epi64(_mm256_and_si256(l, low), _mm256_srli_epi64::<32>(l));
        // SAFETY: this function has the features the join's intrinsics need.
        let Joined {
            pair,
            quad0,
            quad1,
            len0,
            len1,
        } = unsafe { join_eight(w, l, pair_len) };
        let octet = _mm_or_si128(quad0, _mm_sllv_epi64(quad1, len0));
        let octet_len = _mm_cvtsi128_si64(_mm_add_epi64(len0, len1)) as u64;
        if octet_len <= 56 {
            out.put(_mm_cvtsi128_si64(octet) as u64, octet_len as u32);
            continue;
        }
        let quads = [
            (
                _mm_cvtsi128_si64(quad0) as u64,
                _mm_cvtsi128_si64(len0) as u64,
            ),
            (
                _mm_cvtsi128_si64(quad1) as u64,
                _mm_cvtsi128_si64(len1) as u64,
            ),
        ];
        let mut pairs = [0u64; 4];
        let mut pair_lens = [0u64; 4];
        // SAFETY: each store writes the 32 bytes of a 4-element u64 array.
        unsafe {
            _mm256_storeu_si256(pairs.as_mut_ptr().cast(), pair);
            _mm256_storeu_si256(pair_lens.as_mut_ptr().cast(), pair_len);
        }
        for (j, (quad, quad_len)) in quads.into_iter().enumerate() {
            if quad_len <= 56 {
                out.put(quad, quad_len as u32);
                continue;
            }
            for p in 2 * j..2 * j + 2 {
                let (pair, pair_len) = (pairs[p], pair_lens[p]);
                if pair_len <= 56 {
                    out.put(pair, pair_len as u32);
                } else if pair_len <= 64 {
                    out.put(pair & mask(32), 32);
                    out.put(pair >> 32, pair_len as u32 - 32);
                } else {
                    one(out, 8 * o + 2 * p);
                    one(out, 8 * o + 2 * p + 1);
                }
            }
        }
    }
    for i in 8 * octets..word.len() {
        one(out, i);
    }
}

/// Reads bit fields from any bit position of a byte slice.
#[derive(Clone, Copy)]
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        BitReader { data }
    }

    /// The bits from bit `pos` on, in the low bits of the result: at least the low 57 are
    /// those of the stream, the rest are zero. Bits past the end of the slice read as zero,
    /// so a corrupt code word never reads outside it (callers check where code words end).
    #[inline(always)]
    pub(crate) fn peek(&self, pos: usize) -> u64 {
        let at = pos >> 3;
        // One comparison (`at + 8` cannot overflow) and a load; the tail is cold.
        let word = match self.data.get(at..at + 8) {
            Some(bytes) => u64::from_le_bytes(bytes.try_into().unwrap()),
            None => tail(self.data, at),
        };
        word >> (pos & 7)
    }

    /// Reads `N` consecutive code words from bit `*pos` on and moves `*pos` past them.
    /// `word` decodes the code word in the low bits of its argument into `(value, length)`
    /// and must depend on no bit past that length (bits above it may be anything).
    ///
    /// One load serves all `N` words when they fit the bits it holds (at least 57): the chain
    /// from one load to the next is then `N` count-and-shift steps instead of `N` loads. The
    /// words are decoded speculatively and checked afterwards; when they do not fit (long
    /// words, rare) each gets its own load. Either way the result is that of `N` reads at
    /// their exact positions.
    #[inline(always)]
    pub(crate) fn read_n<T: Copy + Default, const N: usize>(
        &self,
        pos: &mut usize,
        word: impl Fn(u64) -> (T, u32),
    ) -> [T; N] {
        let mut bits = self.peek(*pos);
        // Bits of `bits` that are the stream's (the rest are zero).
        let room = 64 - (*pos & 7) as u32;
        let mut values = [T::default(); N];
        let mut used = 0u32;
        for value in &mut values {
            let len;
            (*value, len) = word(bits);
            // Shifting the word itself keeps the sum of lengths off the chain. Past `room`
            // the result is discarded, so the shift may wrap.
            bits = bits.wrapping_shr(len);
            used += len;
        }
        if used > room {
            used = 0;
            for value in &mut values {
                let len;
                (*value, len) = word(self.peek(*pos + used as usize));
                used += len;
            }
        }
        *pos += used as usize;
        values
    }
}

/// The up to 8 bytes of `data` from byte `at` on (zeros past its end). Takes the slice by
/// value: a reference to the reader would keep a cursor that holds it out of registers.
#[cold]
#[inline(never)]
fn tail(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    if let Some(rest) = data.get(at..) {
        let n = rest.len().min(8);
        bytes[..n].copy_from_slice(&rest[..n]);
    }
    u64::from_le_bytes(bytes)
}

/// A read position with the next bits cached in a register: consuming a field is a shift,
/// and memory is touched only when fewer bits remain than the next field may need.
pub(crate) struct BitCursor<'a> {
    reader: BitReader<'a>,
    /// Stream position of `buf`'s lowest bit.
    pos: usize,
    buf: u64,
    /// Bits of `buf` that are the stream's (the bits above are zero).
    avail: u32,
}

impl<'a> BitCursor<'a> {
    pub(crate) fn new(reader: BitReader<'a>, pos: usize) -> Self {
        let mut cursor = BitCursor {
            reader,
            pos,
            buf: 0,
            avail: 0,
        };
        cursor.refill();
        cursor
    }

    #[inline(always)]
    fn refill(&mut self) {
        self.buf = self.reader.peek(self.pos);
        self.avail = 64 - (self.pos & 7) as u32;
    }

    /// Makes at least `bits` (at most 57) of the stream available in [`BitCursor::bits`].
    #[inline(always)]
    pub(crate) fn need(&mut self, bits: u32) {
        debug_assert!(bits <= 57);
        if self.avail < bits {
            self.refill();
        }
    }

    /// The cached bits, next bit lowest.
    #[inline(always)]
    pub(crate) fn bits(&self) -> u64 {
        self.buf
    }

    /// Moves past `len` bits, which [`BitCursor::need`] must have made available.
    #[inline(always)]
    pub(crate) fn skip(&mut self, len: u32) {
        debug_assert!(len <= self.avail && len < 64);
        self.buf >>= len;
        self.avail -= len;
        self.pos += len as usize;
    }

    /// Bit position in the stream.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

/// Whether this CPU runs the codecs' x86-64 builds for one set of features (AVX2 for
/// wide vector loops; BMI1/2, LZCNT and POPCNT for shifts by a register without the `cl`
/// shuffle and one-instruction bit counts). Detection is cached by the standard library.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn x86_wide() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi1")
        && std::arch::is_x86_feature_detected!("bmi2")
        && std::arch::is_x86_feature_detected!("lzcnt")
        && std::arch::is_x86_feature_detected!("popcnt")
}

/// Whether this CPU also runs the codecs' AVX-512 builds: [`x86_wide`] plus AVX-512 F, BW, CD,
/// VBMI2 and VPOPCNTDQ (Ice Lake and Zen 4 on), every feature any of those builds enables, so
/// that one check covers them all. Detection is cached by the standard library.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn x86_avx512() -> bool {
    x86_wide()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512cd")
        && std::arch::is_x86_feature_detected!("avx512vbmi2")
        && std::arch::is_x86_feature_detected!("avx512vpopcntdq")
}

/// Asks the CPU to bring `items` into its caches ahead of use, one request per cache line;
/// no effect on results. The `ulp` decoder works a block at a time in L1 and then reads the
/// block's old values in a burst: on new data those reads waited on memory (the next blocks'
/// old values asked for early: 4–12 % faster decoding at 50 % density, none lost at 10 %;
/// the encoders measured no gain from it: docs/data/codecs/README.md).
#[inline(always)]
pub(crate) fn prefetch<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = items.as_ptr() as *const i8;
        for offset in (0..std::mem::size_of_val(items)).step_by(64) {
            // SAFETY: a prefetch is a hint: it reads no memory the program sees and never
            // faults, here at an address inside a live slice; SSE is part of x86_64.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    start.wrapping_add(offset),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}

/// The low `len` bits set (`len <= 63`).
#[inline(always)]
pub(crate) const fn mask(len: u32) -> u64 {
    (1u64 << len) - 1
}

/// Number of significant bits of `x` (0 for 0), for `x < 2^63`. `2x + 1` is never zero, so
/// this is one `bsr` even on CPUs without `lzcnt` (no zero special case).
#[inline(always)]
pub(crate) fn bit_len(x: u64) -> u32 {
    debug_assert!(x >> 63 == 0);
    63 - ((x << 1) | 1).leading_zeros()
}

/// Checks that a stream of `bits` bits fills `stream` exactly, padding bits zero.
/// `header` is the number of bytes before the stream in the section (for error reports).
pub(crate) fn check_stream_len(
    codec: &'static str,
    stream: &[u8],
    bits: u64,
    header: usize,
    count: u64,
) -> Result<(), crate::error::CodecError> {
    use crate::error::CodecError;
    let needed = bits.div_ceil(8);
    let have = stream.len() as u64;
    if have < needed {
        return Err(CodecError::Truncated {
            needed: header as u64 + needed,
            available: header as u64 + have,
        });
    }
    if have > needed {
        return Err(CodecError::TrailingBytes {
            count,
            extra: have - needed,
        });
    }
    let used = (bits % 8) as u32;
    if used != 0 && stream.last().is_some_and(|&last| last >> used != 0) {
        return Err(CodecError::Malformed {
            codec,
            reason: "padding bits after the last code word are not zero".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_reader_and_cursor_agree_on_fields_of_every_width() {
        let fields: Vec<(u64, u32)> = (0..2000u64)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15), (i % 57) as u32))
            .collect();
        let total: u64 = fields.iter().map(|&(_, l)| l as u64).sum();
        let mut buf = vec![0xaa];
        let mut w = BitWriter::new(&mut buf);
        let (first, second) = fields.split_at(fields.len() / 2);
        for part in [first, second] {
            let bits = part.iter().map(|&(_, l)| l as u64).sum::<u64>();
            w.block(bits, |b| {
                for &(v, l) in part {
                    b.put(v & mask(l), l);
                }
            });
        }
        w.block(130, |b| b.zeros(130));
        assert_eq!(w.bits_since(1), total + 130);
        w.finish();
        assert_eq!(buf.len(), 1 + (total + 130).div_ceil(8) as usize);
        assert_eq!(buf[0], 0xaa);
        let r = BitReader::new(&buf[1..]);
        let mut cursor = BitCursor::new(r, 0);
        let mut pos = 0usize;
        for &(v, l) in &fields {
            assert_eq!(r.peek(pos) & mask(l), v & mask(l));
            cursor.need(l);
            assert_eq!(cursor.bits() & mask(l), v & mask(l));
            cursor.skip(l);
            pos += l as usize;
        }
        assert_eq!(cursor.pos(), pos);
        assert_eq!(r.peek(pos), 0);
        assert_eq!(r.peek(pos + 10_000), 0);
    }

    #[test]
    fn writer_writes_in_place_over_whatever_the_spare_capacity_held() {
        // Blocks of every size up to a few hundred bits (empty, one bit, partial bytes),
        // written into a vector reused with other bytes in its spare capacity, against a
        // bit-by-bit reference.
        let mut h = 7u64;
        let mut next = || {
            h = h
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(0x632b_e59b_d9b4_e019);
            h >> 11
        };
        for prefix in [0usize, 1, 5, 8] {
            let blocks: Vec<Vec<(u64, u32)>> = (0..300)
                .map(|b| {
                    let count = if b % 7 == 0 {
                        0
                    } else {
                        (next() % 40) as usize
                    };
                    (0..count)
                        .map(|_| {
                            let l = (next() % 57) as u32;
                            (next() & mask(l), l)
                        })
                        .collect()
                })
                .collect();
            let mut expected_bits = Vec::new();
            for &(v, l) in blocks.iter().flatten() {
                expected_bits.extend((0..l).map(|i| (v >> i & 1) as u8));
            }
            let mut expected = vec![0x3cu8; prefix];
            for byte in expected_bits.chunks(8) {
                expected.push(byte.iter().enumerate().fold(0, |x, (i, &b)| x | b << i));
            }
            let mut buf = vec![0xffu8; 3 * SCRATCH];
            buf.truncate(prefix);
            buf.fill(0x3c);
            let mut w = BitWriter::new(&mut buf);
            for block in &blocks {
                let bits = block.iter().map(|&(_, l)| l as u64).sum();
                w.block(bits, |b| {
                    for &(v, l) in block {
                        b.put(v, l);
                    }
                });
            }
            assert_eq!(w.bits_since(prefix), expected_bits.len() as u64);
            w.finish();
            assert_eq!(buf, expected, "prefix {prefix}");
        }
    }

    #[test]
    fn read_n_matches_reads_at_each_position() {
        // A prefix code: z zeros, a one, then a 3z-bit value (up to 45 bits for z = 11).
        // Mostly short words (several per load), some long ones (the one-load-each path).
        let decode = |word: u64| {
            let z = word.trailing_zeros().min(11);
            ((word >> (z + 1)) & mask(3 * z), 4 * z + 1)
        };
        let fields: Vec<(u64, u32)> = (0..3000u64)
            .map(|i| {
                let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let z = (h >> 60) as u32 % if i % 5 == 0 { 12 } else { 3 };
                (h & mask(3 * z), z)
            })
            .collect();
        let bits: u64 = fields.iter().map(|&(_, z)| 4 * z as u64 + 1).sum();
        let mut buf = Vec::new();
        let mut w = BitWriter::new(&mut buf);
        w.block(bits, |b| {
            for &(v, z) in &fields {
                b.put(((v << 1) | 1) << z, 4 * z + 1);
            }
        });
        w.finish();
        let r = BitReader::new(&buf);
        let mut pos = 0;
        for group in fields.chunks_exact(3) {
            let read: [u64; 3] = r.read_n(&mut pos, decode);
            assert_eq!(read, [group[0].0, group[1].0, group[2].0]);
        }
        assert_eq!(pos as u64, bits);
    }

    #[test]
    fn stream_length_checks() {
        assert!(check_stream_len("t", &[0x01], 1, 0, 1).is_ok());
        assert!(check_stream_len("t", &[0x03], 1, 0, 1).is_err());
        assert!(check_stream_len("t", &[0x01, 0], 1, 0, 1).is_err());
        assert!(check_stream_len("t", &[], 1, 0, 1).is_err());
        assert!(check_stream_len("t", &[0xff], 8, 0, 1).is_ok());
        assert!(check_stream_len("t", &[], 0, 0, 0).is_ok());
    }
}
