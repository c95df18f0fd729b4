//! Code numbers as the encoder holds them, shared by its portable build (`encode.rs`) and its
//! x86 kernels (`x86.rs`): the storage trait (16 or 32 bits a number) and the length
//! histogram a block's parameters are chosen from.

/// Slot of unchanged elements in the length histogram: above every real length (at most
/// `nb`), so `encode::best_params` counts them as raw.
pub(super) const UNCHANGED_SLOT: usize = 33;

/// Slots of the length histogram (a power of two: lengths index it without bounds checks).
pub(super) const HIST: usize = 64;

/// Bit length histogram of one block: `[L]` for steps whose code number has `L` bits, and
/// `[UNCHANGED_SLOT]` for unchanged elements (always raw).
pub(super) type Histogram = [u32; HIST];

/// Storage of code numbers in the encoder: 16 bits for narrow elements (so the loops over
/// them vectorize eight lanes wide), 32 for 4-byte ones.
pub(super) trait Code: Copy + Into<u32> {
    fn of(u: u32) -> Self;

    /// The bit length histogram of one block's code numbers.
    fn histogram<const W: usize>(codes: &[Self]) -> Histogram;

    /// The code numbers as 16-bit ones, if they are.
    fn narrow(_codes: &[Self]) -> Option<&[u16]> {
        None
    }

    /// [`Code::histogram`] in the AVX2 build where there is one (narrow code numbers).
    ///
    /// # Safety
    ///
    /// The CPU must have the features of [`crate::codec::bits::x86_wide`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn histogram_wide<const W: usize>(codes: &[Self]) -> Histogram {
        Self::histogram::<W>(codes)
    }
}
