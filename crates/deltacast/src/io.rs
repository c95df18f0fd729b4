//! safetensors checkpoints as slots: read memory-mapped, write atomically.

use std::borrow::Cow;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, View};
use safetensors::SafeTensors;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::slot::{SlotInfo, SlotTable};

/// The safetensors dtype of each of ours (every byte-aligned one safetensors has; the
/// sub-byte F4/F6 formats are refused on reading).
fn to_safetensors(d: DType) -> Dtype {
    match d {
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::F32 => Dtype::F32,
        DType::F8E4M3 => Dtype::F8_E4M3,
        DType::F8E5M2 => Dtype::F8_E5M2,
        DType::Bool => Dtype::BOOL,
        DType::U8 => Dtype::U8,
        DType::I8 => Dtype::I8,
        DType::U16 => Dtype::U16,
        DType::I16 => Dtype::I16,
        DType::U32 => Dtype::U32,
        DType::I32 => Dtype::I32,
        DType::U64 => Dtype::U64,
        DType::I64 => Dtype::I64,
        DType::F64 => Dtype::F64,
        DType::F8E8M0 => Dtype::F8_E8M0,
    }
}

fn from_safetensors(d: Dtype, tensor: &str) -> Result<DType> {
    DType::ALL
        .into_iter()
        .find(|&ours| to_safetensors(ours) == d)
        .ok_or_else(|| Error::UnsupportedDType(format!("{d:?} (tensor `{tensor}`)")))
}

/// A memory-mapped safetensors file seen as a slot table (tensors sorted by name) and bytes.
pub struct Checkpoint {
    mmap: Mmap,
    table: SlotTable,
    /// Byte range of each slot inside the map.
    ranges: Vec<(usize, usize)>,
}

impl Checkpoint {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only and private to this process; like every reader of
        // memory-mapped checkpoints we assume no other process truncates the file meanwhile.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let st = SafeTensors::deserialize(&mmap)?;
        let mut tensors = st.tensors();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let base = mmap.as_ptr() as usize;
        let mut slots = Vec::with_capacity(tensors.len());
        let mut ranges = Vec::with_capacity(tensors.len());
        for (name, view) in &tensors {
            let dtype = from_safetensors(view.dtype(), name)?;
            slots.push(SlotInfo::new(
                name.clone(),
                dtype,
                view.shape().iter().map(|&d| d as u64).collect(),
            ));
            let start = view.data().as_ptr() as usize - base;
            ranges.push((start, start + view.data().len()));
        }
        drop(tensors);
        let table = SlotTable::new(slots)?;
        Ok(Checkpoint {
            mmap,
            table,
            ranges,
        })
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    pub fn slot_bytes(&self, id: u32) -> &[u8] {
        let (a, b) = self.ranges[id as usize];
        &self.mmap[a..b]
    }

    /// Every slot's bytes in table order, borrowed from the map.
    pub fn slices(&self) -> Vec<&[u8]> {
        (0..self.table.len() as u32)
            .map(|id| self.slot_bytes(id))
            .collect()
    }

    /// Owned copies of every slot (a receiver's store).
    pub fn to_buffers(&self) -> Vec<Vec<u8>> {
        self.slices().into_iter().map(<[u8]>::to_vec).collect()
    }
}

struct SlotView<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    data: &'a [u8],
}

impl View for SlotView<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes slots as a safetensors file: into a temporary file beside `path`, synced to disk,
/// then renamed over `path`, so `path` either keeps its old content or holds the whole new one.
pub fn write_checkpoint(
    path: impl AsRef<Path>,
    table: &SlotTable,
    buffers: &[&[u8]],
) -> Result<()> {
    let path = path.as_ref();
    if buffers.len() != table.len() {
        return Err(Error::InvalidArgument(format!(
            "{} buffers for {} slots",
            buffers.len(),
            table.len()
        )));
    }
    let mut views = Vec::with_capacity(table.len());
    for (slot, data) in table.slots().iter().zip(buffers) {
        if data.len() as u64 != slot.nbytes() {
            return Err(Error::SlotMismatch {
                slot: slot.name.clone(),
                reason: format!("{} bytes given, {} needed", data.len(), slot.nbytes()),
            });
        }
        views.push((
            slot.name.clone(),
            SlotView {
                dtype: to_safetensors(slot.dtype),
                shape: slot.shape.iter().map(|&d| d as usize).collect(),
                data,
            },
        ));
    }
    let temp = temp_path(path);
    let result = (|| {
        safetensors::serialize_to_file(views, None, &temp)?;
        File::open(&temp)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(&temp, e))?;
        std::fs::rename(&temp, path).map_err(|e| Error::io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// A hidden temporary name in the same directory (so the rename stays on one filesystem).
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// Writes bytes atomically (temp file, fsync, rename).
pub fn write_atomic(path: impl AsRef<Path>, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let path = path.as_ref();
    let temp = temp_path(path);
    let result = (|| {
        let mut f = File::create(&temp).map_err(|e| Error::io(&temp, e))?;
        f.write_all(bytes)
            .and_then(|_| f.sync_all())
            .map_err(|e| Error::io(&temp, e))?;
        std::fs::rename(&temp, path).map_err(|e| Error::io(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("all.safetensors");
        // Odd and empty shapes; names sort in table order.
        let slots: Vec<SlotInfo> = DType::ALL
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let shape = match i % 3 {
                    0 => vec![7, 3],
                    1 => vec![0, 5],
                    _ => vec![],
                };
                SlotInfo::new(format!("t{i:02}"), d, shape)
            })
            .collect();
        let table = SlotTable::new(slots).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let buffers: Vec<Vec<u8>> = table
            .slots()
            .iter()
            .map(|s| {
                (0..s.nbytes())
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            })
            .collect();
        let views: Vec<&[u8]> = buffers.iter().map(Vec::as_slice).collect();
        write_checkpoint(&path, &table, &views).unwrap();
        let back = Checkpoint::open(&path).unwrap();
        assert_eq!(back.table(), &table);
        assert_eq!(back.to_buffers(), buffers);
        // The file says I64, not two I32 words: safetensors sees the element dtype and shape.
        let bytes = std::fs::read(&path).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let i64_slot = table
            .slots()
            .iter()
            .find(|s| s.dtype == DType::I64)
            .unwrap();
        let view = st.tensor(&i64_slot.name).unwrap();
        assert_eq!(view.dtype(), Dtype::I64);
        assert_eq!(
            view.shape().iter().map(|&d| d as u64).collect::<Vec<_>>(),
            i64_slot.shape
        );
    }

    #[test]
    fn sub_byte_dtypes_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f4.safetensors");
        let view = SlotView {
            dtype: Dtype::F4,
            shape: vec![4],
            data: &[0u8; 2],
        };
        safetensors::serialize_to_file([("packed".to_string(), view)], None, &path).unwrap();
        let err = Checkpoint::open(&path).err().expect("F4 is refused");
        assert_eq!(
            err.to_string(),
            "dtype F4 (tensor `packed`) is not supported"
        );
    }
}
