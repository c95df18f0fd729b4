//! Element types. deltacast never does float arithmetic on weights: every element is a bit
//! pattern, compared and moved as unsigned integers of 1, 2 or 4 bytes ("sync words"), so NaN
//! payloads, ±0 and subnormals survive untouched. An 8-byte element (I64, U64, F64) is two
//! 4-byte words, low word first (little-endian), so every kernel and codec works on 1, 2 or 4
//! bytes whatever the dtype.
//!
//! Only the float dtypes of at most 4 bytes have a value order the `ulp` codec can step along;
//! integer, bool and 8-byte dtypes are synced as raw bit patterns ([`DType::ulp_codable`]).

use crate::error::{Error, Result};

/// The element types deltacast syncs. The code is the byte used on the wire and in the
/// slot-table hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    BF16,
    F16,
    F32,
    F8E4M3,
    F8E5M2,
    /// One byte per element, 0 or 1 (synced as the byte, whatever it holds).
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F64,
    /// The unsigned power-of-two scale of the MX formats (no sign: raw bits only).
    F8E8M0,
}

impl DType {
    /// Every dtype; the five float dtypes the `ulp` codec can carry come first.
    pub const ALL: [DType; 16] = [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::F8E4M3,
        DType::F8E5M2,
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F64,
        DType::F8E8M0,
    ];

    /// Bytes per tensor element.
    pub const fn element_size(self) -> usize {
        match self {
            DType::U64 | DType::I64 | DType::F64 => 8,
            DType::F32 | DType::U32 | DType::I32 => 4,
            DType::BF16 | DType::F16 | DType::U16 | DType::I16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::F8E8M0 | DType::Bool | DType::U8 | DType::I8 => {
                1
            }
        }
    }

    /// Bytes per sync word: what diffs, codecs, digests and positions count in (1, 2 or 4).
    /// The element size, except for 8-byte dtypes, whose elements are two 4-byte words.
    pub const fn width(self) -> usize {
        match self.element_size() {
            8 => 4,
            size => size,
        }
    }

    /// Sync words per element: 2 for 8-byte dtypes, else 1.
    pub const fn words_per_element(self) -> u64 {
        (self.element_size() / self.width()) as u64
    }

    /// Whether values may be coded as `ulp` steps: only floats of one word, whose
    /// ordered-integer view ([`to_ordered`]) follows the float order. Integer, bool and
    /// 8-byte values are raw bit patterns (steps of their words would mean nothing).
    pub const fn ulp_codable(self) -> bool {
        matches!(
            self,
            DType::BF16 | DType::F16 | DType::F32 | DType::F8E4M3 | DType::F8E5M2
        )
    }

    /// The byte that names this dtype on the wire and in the slot-table hash.
    pub const fn code(self) -> u8 {
        match self {
            DType::BF16 => 1,
            DType::F16 => 2,
            DType::F32 => 3,
            DType::F8E4M3 => 4,
            DType::F8E5M2 => 5,
            DType::Bool => 6,
            DType::U8 => 7,
            DType::I8 => 8,
            DType::U16 => 9,
            DType::I16 => 10,
            DType::U32 => 11,
            DType::I32 => 12,
            DType::U64 => 13,
            DType::I64 => 14,
            DType::F64 => 15,
            DType::F8E8M0 => 16,
        }
    }

    pub fn from_code(code: u8) -> Result<Self> {
        DType::ALL
            .into_iter()
            .find(|d| d.code() == code)
            .ok_or(Error::UnknownDType(code))
    }

    /// The name safetensors (and torch) use.
    pub const fn name(self) -> &'static str {
        match self {
            DType::BF16 => "BF16",
            DType::F16 => "F16",
            DType::F32 => "F32",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::Bool => "BOOL",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::U16 => "U16",
            DType::I16 => "I16",
            DType::U32 => "U32",
            DType::I32 => "I32",
            DType::U64 => "U64",
            DType::I64 => "I64",
            DType::F64 => "F64",
            DType::F8E8M0 => "F8_E8M0",
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        let upper = name.to_ascii_uppercase().replace('_', "");
        DType::ALL
            .into_iter()
            .find(|d| d.name().replace('_', "") == upper)
            .ok_or_else(|| Error::UnsupportedDType(name.to_string()))
    }

    /// Number of sync words in `bytes`, or an error when the length is not a multiple of the
    /// element size.
    pub fn elements_in(self, bytes: &[u8]) -> Result<usize> {
        if !bytes.len().is_multiple_of(self.element_size()) {
            return Err(Error::Misaligned {
                len: bytes.len(),
                dtype: self.name().to_string(),
            });
        }
        Ok(bytes.len() / self.width())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Reads element `index` of a little-endian buffer of `width`-byte elements as an integer.
#[inline(always)]
pub fn load_bits(bytes: &[u8], width: usize, index: usize) -> u32 {
    let at = index * width;
    match width {
        1 => bytes[at] as u32,
        2 => u16::from_le_bytes([bytes[at], bytes[at + 1]]) as u32,
        _ => u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]),
    }
}

/// Writes `bits` as element `index` of a little-endian buffer of `width`-byte elements.
#[inline(always)]
pub fn store_bits(bytes: &mut [u8], width: usize, index: usize, bits: u32) {
    let at = index * width;
    bytes[at..at + width].copy_from_slice(&bits.to_le_bytes()[..width]);
}

/// Maps a sign-magnitude float bit pattern of `width` bytes to an unsigned integer whose order
/// follows the float order (−NaN < −inf < … < −0 < +0 < … < +inf < +NaN). It is a bijection on
/// all patterns, so the difference of two mapped values is an exact, reversible "ULP distance".
#[inline(always)]
pub fn to_ordered(bits: u32, width: usize) -> u32 {
    let total = (width * 8) as u32;
    let sign = 1u32 << (total - 1);
    let mask = if total == 32 {
        u32::MAX
    } else {
        (1u32 << total) - 1
    };
    if bits & sign != 0 {
        !bits & mask
    } else {
        bits | sign
    }
}

/// Inverse of [`to_ordered`].
#[inline(always)]
pub fn from_ordered(ordered: u32, width: usize) -> u32 {
    let total = (width * 8) as u32;
    let sign = 1u32 << (total - 1);
    let mask = if total == 32 {
        u32::MAX
    } else {
        (1u32 << total) - 1
    };
    if ordered & sign != 0 {
        ordered & !sign
    } else {
        !ordered & mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_code(d.code()).unwrap(), d);
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
        }
        assert!(DType::from_code(0).is_err());
        assert!(DType::from_code(17).is_err());
        assert!(DType::from_name("F4").is_err());
        assert_eq!(DType::from_name("int64").ok(), None);
        assert_eq!(DType::from_name("f8_e4m3").unwrap(), DType::F8E4M3);
        // Codes and names are unique.
        for (i, a) in DType::ALL.iter().enumerate() {
            for b in &DType::ALL[i + 1..] {
                assert_ne!(a.code(), b.code());
                assert_ne!(a.name(), b.name());
            }
        }
    }

    #[test]
    fn words_cover_elements_and_only_one_word_floats_are_ulp_coded() {
        for d in DType::ALL {
            assert!(matches!(d.width(), 1 | 2 | 4), "{d}");
            assert_eq!(
                d.width() as u64 * d.words_per_element(),
                d.element_size() as u64
            );
        }
        assert_eq!(DType::I64.width(), 4);
        assert_eq!(DType::I64.words_per_element(), 2);
        assert_eq!(DType::Bool.element_size(), 1);
        let ulp: Vec<DType> = DType::ALL.into_iter().filter(|d| d.ulp_codable()).collect();
        assert_eq!(ulp, DType::ALL[..5]);
        assert_eq!(DType::I64.elements_in(&[0; 16]).unwrap(), 4);
        let err = DType::I64.elements_in(&[0; 12]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "buffer of 12 bytes is not a whole number of I64 elements"
        );
    }

    #[test]
    fn ordered_view_is_a_monotonic_bijection() {
        for width in [1usize, 2] {
            let n = 1u32 << (width * 8);
            let mut seen = vec![false; n as usize];
            for b in 0..n {
                let o = to_ordered(b, width);
                assert!(o < n);
                assert!(!seen[o as usize]);
                seen[o as usize] = true;
                assert_eq!(from_ordered(o, width), b);
            }
        }
        // Float order on non-NaN f32 patterns.
        let vals = [
            f32::NEG_INFINITY,
            -1.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
        ];
        for w in vals.windows(2) {
            assert!(to_ordered(w[0].to_bits(), 4) < to_ordered(w[1].to_bits(), 4));
        }
        for b in [0u32, 1, 0x7f80_0001, 0xffff_ffff, 0x8000_0000] {
            assert_eq!(from_ordered(to_ordered(b, 4), 4), b);
        }
    }
}
