//! Bit packing shared by the entropy-coded sections (`gaps`, `ulp`).
//!
//! Bits fill each byte from its least significant bit up and bytes follow in order, so the bits
//! from any position are one little-endian 8-byte load and a shift away: a decoder reads the
//! next code word from the low bits and a unary prefix with one `trailing_zeros`, with no
//! per-bit loop and no state beyond a bit position (blocks can start anywhere).

/// Writes bit fields into a buffer whose exact size is known in advance (the encoders size
/// every block before writing it), plus 8 bytes of slack so each field is one 8-byte store.
pub(crate) struct BitWriter<'a> {
    buf: &'a mut [u8],
    /// Byte that holds the first bit not yet final.
    byte: usize,
    /// Pending bits (the low `n`), already stored at `buf[byte..]` but not yet complete.
    acc: u64,
    n: u32,
}

impl<'a> BitWriter<'a> {
    /// `buf` must hold the bytes to be written plus 8 (see [`BitWriter::slack`]) and be zeroed
    /// where the stream will go.
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        BitWriter {
            buf,
            byte: 0,
            acc: 0,
            n: 0,
        }
    }

    /// Extra bytes past the end of the stream that [`BitWriter::put`] may touch.
    pub(crate) const SLACK: usize = 8;

    /// Appends the low `len` bits of `bits` (`len <= 56`; higher bits must be zero).
    /// Panics only if the caller sized the buffer too small, which is a bug in the encoder.
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

    /// Bits written so far.
    pub(crate) fn bits(&self) -> u64 {
        self.byte as u64 * 8 + self.n as u64
    }
}

/// Reads bit fields at arbitrary bit positions of a byte slice.
#[derive(Clone, Copy)]
pub(crate) struct BitReader<'a> {
    data: &'a [u8],
}

impl<'a> BitReader<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        BitReader { data }
    }

    /// The bits from bit `pos` on, in the low bits of the result. At least the low 57 bits
    /// are those of the stream; bits past its end read as zero, so a corrupt code word can
    /// never read outside the slice (the caller checks where the code words ended).
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
    fn writer_and_reader_agree_on_fields_of_every_width() {
        let fields: Vec<(u64, u32)> = (0..2000u64)
            .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15), (i % 57) as u32))
            .collect();
        let total: u64 = fields.iter().map(|&(_, l)| l as u64).sum();
        let mut buf = vec![0u8; (total + 130).div_ceil(8) as usize + BitWriter::SLACK];
        let mut w = BitWriter::new(&mut buf);
        for &(v, l) in &fields {
            w.put(v & mask(l), l);
        }
        w.zeros(130);
        assert_eq!(w.bits(), total + 130);
        let r = BitReader::new(&buf[..(total + 130).div_ceil(8) as usize]);
        let mut pos = 0usize;
        for &(v, l) in &fields {
            assert_eq!(r.peek(pos) & mask(l), v & mask(l));
            pos += l as usize;
        }
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
