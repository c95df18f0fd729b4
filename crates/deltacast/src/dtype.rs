//! Element types. deltacast never does float arithmetic on weights: every element is a bit
//! pattern of 1, 2 or 4 bytes, compared and moved as an unsigned integer, so NaN payloads,
//! ±0 and subnormals survive untouched.

use crate::error::{Error, Result};

/// The element types deltacast syncs. The code is the byte used on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    BF16,
    F16,
    F32,
    F8E4M3,
    F8E5M2,
}

impl DType {
    pub const ALL: [DType; 5] = [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::F8E4M3,
        DType::F8E5M2,
    ];

    /// Bytes per element.
    pub const fn width(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }

    /// The byte that names this dtype on the wire and in the slot-table hash.
    pub const fn code(self) -> u8 {
        match self {
            DType::BF16 => 1,
            DType::F16 => 2,
            DType::F32 => 3,
            DType::F8E4M3 => 4,
            DType::F8E5M2 => 5,
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
        }
    }

    pub fn from_name(name: &str) -> Result<Self> {
        let upper = name.to_ascii_uppercase().replace('_', "");
        DType::ALL
            .into_iter()
            .find(|d| d.name().replace('_', "") == upper)
            .ok_or_else(|| Error::UnsupportedDType(name.to_string()))
    }

    /// Number of elements in `bytes`, or an error when the length is not a multiple of the width.
    pub fn elements_in(self, bytes: &[u8]) -> Result<usize> {
        if !bytes.len().is_multiple_of(self.width()) {
            return Err(Error::Misaligned {
                len: bytes.len(),
                dtype: self,
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
        assert!(DType::from_name("I64").is_err());
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
