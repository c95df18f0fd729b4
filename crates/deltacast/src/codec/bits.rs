//! Bit packing shared by the entropy-coded sections (`gaps`, `ulp`).
//!
//! Bits fill each byte from its least significant bit up and bytes follow in order, so the bits
//! from any position are one little-endian 8-byte load and a shift away: a decoder keeps up to
//! 64 bits in a register, reads a unary prefix with one `trailing_zeros` and the fields after it
//! with shifts, with no per-bit loop; a block can start at any bit.

/// Appends a bit stream to a byte vector, one block at a time: [`BitWriter::block`] makes
/// room for the block's exact size (the encoders size each block before writing it) and hands
/// out a [`BlockWriter`] over that room.
pub(crate) struct BitWriter<'a> {
    out: &'a mut Vec<u8>,
    /// Byte that holds the first bit not yet final.
    byte: usize,
    /// Pending bits (the low `n`, fewer than 8), already stored at `out[byte]`.
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    /// Starts a bit stream at the end of `out`.
    pub(crate) fn new(out: &'a mut Vec<u8>) -> Self {
        let byte = out.len();
        BitWriter {
            out,
            byte,
            acc: 0,
            n: 0,
        }
    }

    /// Writes `bits` more bits with `write`. The block writer works on a plain slice and local
    /// state, so the hot loop keeps everything in registers.
    #[inline(always)]
    pub(crate) fn block<R>(
        &mut self,
        bits: u64,
        write: impl FnOnce(&mut BlockWriter<'_>) -> R,
    ) -> R {
        // Room for the block plus the 8 bytes a store may touch past its end.
        let end = self.byte + (self.n as u64 + bits).div_ceil(8) as usize + 8;
        if self.out.len() < end {
            self.out.resize(end, 0);
        }
        let mut block = BlockWriter {
            buf: &mut self.out[self.byte..end],
            byte: 0,
            acc: self.acc,
            n: self.n,
        };
        let result = write(&mut block);
        debug_assert_eq!(
            block.byte as u64 * 8 + block.n as u64,
            self.n as u64 + bits,
            "block size"
        );
        self.byte += block.byte;
        self.acc = block.acc;
        self.n = block.n;
        result
    }

    /// Bits written since `start_byte` (a byte offset in the vector).
    pub(crate) fn bits_since(&self, start_byte: usize) -> u64 {
        (self.byte - start_byte) as u64 * 8 + self.n as u64
    }

    /// Ends the stream: drops the spare room, keeps the last partial byte (zero padded).
    pub(crate) fn finish(self) {
        let end = self.byte + self.n.div_ceil(8) as usize;
        self.out.truncate(end);
    }
}

/// Writes the code words of one block: every field is one unaligned 8-byte store, with no
/// branch per byte.
pub(crate) struct BlockWriter<'b> {
    buf: &'b mut [u8],
    byte: usize,
    acc: u64,
    n: u32,
}

impl BlockWriter<'_> {
    /// Appends the low `len` bits of `bits` (`len <= 56`; higher bits must be zero).
    /// Panics only if the encoder sized the block too small, which is a bug, not bad data.
    #[inline(always)]
    pub(crate) fn put(&mut self, bits: u64, len: u32) {
        debug_assert!(len <= 56, "field of {len} bits");
        debug_assert!(bits >> len == 0, "bits above the field");
        self.acc |= bits << self.n;
        self.n += len;
        self.buf[self.byte..self.byte + 8].copy_from_slice(&self.acc.to_le_bytes());
        let whole = self.n / 8;
        self.byte += whole as usize;
        self.acc >>= whole * 8;
        self.n -= whole * 8;
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
        let word = match self.data.get(at..).and_then(|rest| rest.first_chunk::<8>()) {
            Some(bytes) => u64::from_le_bytes(*bytes),
            None => self.tail(at),
        };
        word >> (pos & 7)
    }

    #[cold]
    #[inline(never)]
    fn tail(&self, at: usize) -> u64 {
        let mut bytes = [0u8; 8];
        if let Some(rest) = self.data.get(at..) {
            let n = rest.len().min(8);
            bytes[..n].copy_from_slice(&rest[..n]);
        }
        u64::from_le_bytes(bytes)
    }
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

/// The low `len` bits set (`len <= 63`).
#[inline(always)]
pub(crate) fn mask(len: u32) -> u64 {
    (1u64 << len) - 1
}

/// Number of significant bits of `x` (0 for 0).
#[inline(always)]
pub(crate) fn bit_len(x: u64) -> u32 {
    64 - x.leading_zeros()
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
#[path = "testutil.rs"]
pub(crate) mod testutil;

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
    fn stream_length_checks() {
        assert!(check_stream_len("t", &[0x01], 1, 0, 1).is_ok());
        assert!(check_stream_len("t", &[0x03], 1, 0, 1).is_err());
        assert!(check_stream_len("t", &[0x01, 0], 1, 0, 1).is_err());
        assert!(check_stream_len("t", &[], 1, 0, 1).is_err());
        assert!(check_stream_len("t", &[0xff], 8, 0, 1).is_ok());
        assert!(check_stream_len("t", &[], 0, 0, 0).is_ok());
    }
}
