//! The slot table: the static list of final tensors (name, dtype, shape) that every rank and
//! every receiver agrees on. Its hash travels in every frame so a receiver with another table
//! refuses a sync before touching its weights.

use std::collections::HashMap;

use crate::dtype::DType;
use crate::error::{Error, Result};

/// One final tensor as the receiver names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

impl SlotInfo {
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<u64>) -> Self {
        SlotInfo {
            name: name.into(),
            dtype,
            shape,
        }
    }

    /// Tensor elements: the shape's product (1 for a scalar, 0 if any dimension is 0).
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Sync words ([`DType::width`] bytes each): the elements, twice over for 8-byte dtypes.
    /// Positions, chunk ranges, change counts and digests all count in these.
    pub fn numel(&self) -> u64 {
        self.elements() * self.dtype.words_per_element()
    }

    pub fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.width() as u64
    }
}

/// The ordered slot table. A slot's id is its index here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotTable {
    slots: Vec<SlotInfo>,
    by_name: HashMap<String, u32>,
    hash: u64,
}

impl SlotTable {
    /// Builds a table; names must be unique and the count must fit a u32.
    pub fn new(slots: Vec<SlotInfo>) -> Result<Self> {
        if slots.len() > u32::MAX as usize {
            return Err(Error::InvalidArgument("too many slots".into()));
        }
        let mut by_name = HashMap::with_capacity(slots.len());
        for (id, slot) in slots.iter().enumerate() {
            if by_name.insert(slot.name.clone(), id as u32).is_some() {
                return Err(Error::InvalidArgument(format!(
                    "duplicate slot name `{}`",
                    slot.name
                )));
            }
        }
        let hash = Self::compute_hash(&slots);
        Ok(SlotTable {
            slots,
            by_name,
            hash,
        })
    }

    /// A stable 64-bit hash of ids, names, dtypes and shapes (xxh3 over a canonical encoding).
    fn compute_hash(slots: &[SlotInfo]) -> u64 {
        let mut bytes = Vec::with_capacity(slots.len() * 64);
        bytes.extend_from_slice(b"deltacast-slot-table-v1");
        bytes.extend_from_slice(&(slots.len() as u64).to_le_bytes());
        for (id, slot) in slots.iter().enumerate() {
            bytes.extend_from_slice(&(id as u32).to_le_bytes());
            bytes.push(slot.dtype.code());
            bytes.extend_from_slice(&(slot.shape.len() as u32).to_le_bytes());
            for d in &slot.shape {
                bytes.extend_from_slice(&d.to_le_bytes());
            }
            bytes.extend_from_slice(&(slot.name.len() as u32).to_le_bytes());
            bytes.extend_from_slice(slot.name.as_bytes());
        }
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn slots(&self) -> &[SlotInfo] {
        &self.slots
    }

    pub fn get(&self, id: u32) -> Result<&SlotInfo> {
        self.slots.get(id as usize).ok_or(Error::UnknownSlot(id))
    }

    pub fn id_of(&self, name: &str) -> Result<u32> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| Error::UnknownSlotName(name.to_string()))
    }

    /// Total sync words over all slots (see [`SlotInfo::numel`]).
    pub fn total_elements(&self) -> u64 {
        self.slots.iter().map(SlotInfo::numel).sum()
    }

    /// Total bytes over all slots (the size of a full broadcast).
    pub fn total_bytes(&self) -> u64 {
        self.slots.iter().map(SlotInfo::nbytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(names: &[&str]) -> SlotTable {
        SlotTable::new(
            names
                .iter()
                .map(|n| SlotInfo::new(*n, DType::BF16, vec![4, 3]))
                .collect(),
        )
        .unwrap()
    }

    #[test]
    fn hash_is_stable_and_sensitive() {
        let a = table(&["a", "b"]);
        assert_eq!(a.hash(), table(&["a", "b"]).hash());
        assert_ne!(a.hash(), table(&["b", "a"]).hash());
        let shape = SlotTable::new(vec![
            SlotInfo::new("a", DType::BF16, vec![3, 4]),
            SlotInfo::new("b", DType::BF16, vec![4, 3]),
        ])
        .unwrap();
        assert_ne!(a.hash(), shape.hash());
        let dtype = SlotTable::new(vec![
            SlotInfo::new("a", DType::F16, vec![4, 3]),
            SlotInfo::new("b", DType::BF16, vec![4, 3]),
        ])
        .unwrap();
        assert_ne!(a.hash(), dtype.hash());
    }

    #[test]
    fn duplicate_names_are_refused() {
        let err = SlotTable::new(vec![
            SlotInfo::new("a", DType::F32, vec![1]),
            SlotInfo::new("a", DType::F32, vec![1]),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("duplicate"));
    }

    #[test]
    fn lookups() {
        let t = table(&["x", "y"]);
        assert_eq!(t.id_of("y").unwrap(), 1);
        assert!(t.id_of("z").is_err());
        assert!(t.get(2).is_err());
        assert_eq!(t.total_elements(), 24);
        assert_eq!(t.total_bytes(), 48);
    }

    #[test]
    fn eight_byte_elements_are_two_words() {
        let s = SlotInfo::new("step", DType::I64, vec![3]);
        assert_eq!((s.elements(), s.numel(), s.nbytes()), (3, 6, 24));
        let s = SlotInfo::new("mask", DType::Bool, vec![2, 5]);
        assert_eq!((s.elements(), s.numel(), s.nbytes()), (10, 10, 10));
        let s = SlotInfo::new("empty", DType::I32, vec![4, 0]);
        assert_eq!((s.elements(), s.numel(), s.nbytes()), (0, 0, 0));
        // The dtype is part of the hash: an I64 and an F64 table differ.
        let a = SlotTable::new(vec![SlotInfo::new("x", DType::I64, vec![2])]).unwrap();
        let b = SlotTable::new(vec![SlotInfo::new("x", DType::F64, vec![2])]).unwrap();
        assert_ne!(a.hash(), b.hash());
    }
}
