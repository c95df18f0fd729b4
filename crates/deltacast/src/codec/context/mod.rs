//! `ctx` positions and values: the change mask and the ULP steps of a chunk coded with a
//! binary range coder whose probabilities are conditioned on what the receiver already holds,
//! the old bits of each element (docs/codecs.md, "ctx").
//!
//! Why: an element changes when the optimizer's step crosses half an ULP of its BF16 value,
//! and the ULP is set by the element's exponent, so the change probability and the size of the
//! step in ULPs both depend strongly on the exponent. Both sides know the old exponent of every
//! element of the chunk before the sync, so no model parameter travels: every context starts
//! from nothing and learns from what was coded before it (counting models, [`rc::Model`]).
//! On the recorded AdamW trace the exponent alone takes the position entropy to 0.67× of the
//! iid bound and the step entropy to ~0.69× (docs/codecs.md has the figures).
//!
//! Positions need the old bits of **every** element of the chunk's range (the class of an
//! element that did not change decides how its "unchanged" costs), values only those at the
//! changed positions, as `ulp` does. Elements of 2 or 4 bytes only.

pub(crate) mod gaps;
pub(crate) mod rc;

use crate::codec::no_bytes;
use crate::dtype::{load_bits, to_ordered};
use crate::error::CodecError;
use rc::{Decoder, Encoder, Model};

const POS: &str = "ctx positions";
const VAL: &str = "ctx values";

/// Classes of the position model: the 8 bits below the sign (the exponent of BF16 and FP32,
/// the exponent and top 3 mantissa bits of FP16).
const POS_CLASSES: usize = 256;
/// Classes of the value model: the sign and the same 8 bits.
const VAL_CLASSES: usize = 512;

/// Whether elements of `width` bytes can be carried.
pub fn supports(width: usize) -> bool {
    width == 2 || width == 4
}

#[inline]
fn pos_class(bits: u32, nb: u32) -> usize {
    ((bits >> (nb - 9)) & 0xFF) as usize
}

#[inline]
fn val_class(bits: u32, nb: u32) -> usize {
    ((bits >> (nb - 9)) & 0x1FF) as usize
}

fn unsupported(codec: &'static str, width: usize) -> CodecError {
    CodecError::Unsupported {
        codec,
        what: if width == 1 {
            "1-byte elements"
        } else {
            "elements of this width"
        },
    }
}

/// Appends the mask of the chunk: one bit per element from the first up to the last changed
/// one (the decoder knows the count, so nothing after the last change is coded), each with
/// the model of the element's old class. `old` holds the old bits at `rel`, `after` the bits of
/// the whole range after the sync (so the old bits of an unchanged element are its bits there).
/// Nothing is written for no change. `width` must be [`supports`]ed.
pub fn encode_positions(width: usize, rel: &[u32], after: &[u8], old: &[u8], out: &mut Vec<u8>) {
    debug_assert!(supports(width));
    debug_assert_eq!(old.len(), rel.len() * width);
    let Some(&last) = rel.last() else {
        return;
    };
    let nb = 8 * width as u32;
    let mut models = vec![Model::default(); POS_CLASSES];
    let mut enc = Encoder::new(out);
    let mut j = 0;
    for i in 0..=last {
        let changed = rel.get(j) == Some(&i);
        let bits = if changed {
            load_bits(old, width, j)
        } else {
            load_bits(after, width, i as usize)
        };
        j += changed as usize;
        enc.model_bit(&mut models[pos_class(bits, nb)], changed);
    }
    enc.finish();
}

/// Refuses what no context positions decoder can take: elements of another width than 2 or 4
/// bytes, held bits that are not the range's.
pub(crate) fn check_held(
    codec: &'static str,
    width: usize,
    range: u32,
    held: &[u8],
) -> Result<(), CodecError> {
    if !supports(width) {
        return Err(unsupported(codec, width));
    }
    if held.len() as u64 != range as u64 * width as u64 {
        return Err(CodecError::Malformed {
            codec,
            reason: format!(
                "{} held bytes for a range of {range} elements of {width} bytes",
                held.len()
            ),
        });
    }
    Ok(())
}

/// Decodes `count` positions from all of `input`; `held` is the old bits of the whole range.
pub fn decode_positions(
    width: usize,
    input: &[u8],
    count: u32,
    range: u32,
    held: &[u8],
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    check_held(POS, width, range, held)?;
    if count == 0 {
        return no_bytes(input, 0);
    }
    // Each change needs at least a coded bit; the range bounds the loop either way.
    out.reserve(count.min(range) as usize);
    let nb = 8 * width as u32;
    let mut models = vec![Model::default(); POS_CLASSES];
    let mut dec = Decoder::new(input, POS)?;
    let mut i = 0u32;
    while (out.len() as u32) < count {
        if i >= range {
            return Err(CodecError::Malformed {
                codec: POS,
                reason: format!("{} changes in the range, manifest says {count}", out.len()),
            });
        }
        let bits = load_bits(held, width, i as usize);
        if dec.model_bit(&mut models[pos_class(bits, nb)])? {
            out.push(i);
        }
        i += 1;
    }
    dec.finish(count as u64)
}

/// The models of one value class: is the step ±1; the unary length of a larger step; the sign
/// (for ±1 and for larger steps apart).
struct ValModels {
    nb: u32,
    /// `stride` models per class: [one, len[0..nb−1], sign_one, sign_big].
    models: Vec<Model>,
}

impl ValModels {
    fn new(width: usize) -> Self {
        let nb = 8 * width as u32;
        ValModels {
            nb,
            models: vec![Model::default(); VAL_CLASSES * Self::stride(nb)],
        }
    }

    fn stride(nb: u32) -> usize {
        2 * nb as usize + 2
    }

    fn class(&mut self, old: u32) -> &mut [Model] {
        let s = Self::stride(self.nb);
        let c = val_class(old, self.nb);
        &mut self.models[c * s..(c + 1) * s]
    }
}

/// The step from `old` to `new` as (magnitude `v` = |d| with `0 ≤ v ≤ 2^(nb−1)`, negative).
#[inline]
fn step(old: u32, new: u32, width: usize) -> (u32, bool) {
    let nb = 8 * width as u32;
    let mask = if nb == 32 { u32::MAX } else { (1 << nb) - 1 };
    let d = to_ordered(new, width).wrapping_sub(to_ordered(old, width)) & mask;
    let neg = d >> (nb - 1) == 1;
    let v = if neg { d.wrapping_neg() & mask } else { d };
    // d = −2^(nb−1) gives v = 2^(nb−1) (its negation is itself).
    (v, neg)
}

/// Appends the steps from `old` to `new` (the same number of `width`-byte elements). Nothing is
/// written for no element. `width` must be [`supports`]ed.
pub fn encode_values(width: usize, old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    debug_assert!(supports(width));
    debug_assert_eq!(old.len(), new.len());
    let n = old.len() / width;
    if n == 0 {
        return;
    }
    let mut m = ValModels::new(width);
    let nb = m.nb;
    let mut enc = Encoder::new(out);
    for k in 0..n {
        let o = load_bits(old, width, k);
        let (v, neg) = step(o, load_bits(new, width, k), width);
        let models = m.class(o);
        enc.model_bit(&mut models[0], v != 1);
        if v != 1 {
            // t = 0 for an unchanged value, else v − 1 ≥ 1; its bit length L in 0..=nb−1, as
            // "L > j" for j = 0.. (up to nb − 2), then its bits below the leading one.
            let t = v.saturating_sub(1);
            let len = 32 - t.leading_zeros();
            for j in 0..nb - 1 {
                let longer = len > j;
                enc.model_bit(&mut models[1 + j as usize], longer);
                if !longer {
                    break;
                }
            }
            if len > 1 {
                // The bit below the leading one with its own model per length, the rest plain.
                let top = (t >> (len - 2)) & 1 == 1;
                enc.model_bit(&mut models[(nb + 2 + len) as usize - 1], top);
                enc.direct(t, len - 2);
            }
        }
        if v != 0 && v != 1 << (nb - 1) {
            let s = if v == 1 { nb } else { nb + 1 } as usize;
            enc.model_bit(&mut models[s], neg);
        }
    }
    enc.finish();
}

/// Decodes `old.len() / width` new values from all of `input` into `out` (cleared first).
pub fn decode_values(
    width: usize,
    input: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    out.clear();
    if !supports(width) {
        return Err(unsupported(VAL, width));
    }
    let n = old.len() / width;
    if n == 0 {
        return no_bytes(input, 0);
    }
    out.reserve(old.len());
    let mut m = ValModels::new(width);
    let nb = m.nb;
    let mask = if nb == 32 { u32::MAX } else { (1 << nb) - 1 };
    let mut dec = Decoder::new(input, VAL)?;
    for k in 0..n {
        let o = load_bits(old, width, k);
        let models = m.class(o);
        let v = if !dec.model_bit(&mut models[0])? {
            1
        } else {
            // The bit length of t, 0..=nb−1, as that many one bits (then a zero below nb − 1).
            let mut len = 0u32;
            for j in 0..nb - 1 {
                if !dec.model_bit(&mut models[1 + j as usize])? {
                    break;
                }
                len = j + 1;
            }
            let t = match len {
                0 => 0,
                1 => 1,
                _ => {
                    let top = dec.model_bit(&mut models[(nb + 2 + len) as usize - 1])? as u32;
                    (1 << (len - 1)) | (top << (len - 2)) | dec.direct(len - 2)?
                }
            };
            if t == 0 {
                0
            } else {
                t + 1
            }
        };
        let neg = if v != 0 && v != 1 << (nb - 1) {
            let s = if v == 1 { nb } else { nb + 1 } as usize;
            dec.model_bit(&mut models[s])?
        } else {
            v == 1 << (nb - 1)
        };
        let d = if neg { v.wrapping_neg() & mask } else { v };
        let ord = to_ordered(o, width).wrapping_add(d) & mask;
        let bits = crate::dtype::from_ordered(ord, width);
        out.extend_from_slice(&bits.to_le_bytes()[..width]);
    }
    dec.finish(n as u64)
}

#[cfg(test)]
mod tests;
