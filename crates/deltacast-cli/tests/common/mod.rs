//! Helpers of the `deltacast` binary's tests: running it, and writing and reading checkpoints.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use deltacast::io::{write_checkpoint, Checkpoint};
use deltacast::{DType, SlotInfo, SlotTable};

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deltacast"))
}

pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("binary runs");
    assert!(
        out.status.success(),
        "command failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

pub fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().expect("binary runs");
    assert!(
        !out.status.success(),
        "command should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn tensors_of(path: &Path) -> Vec<Vec<u8>> {
    Checkpoint::open(path).unwrap().to_buffers()
}

/// A small deterministic generator (splitmix64), independent of the code under test.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Writes `tensors` (name, dtype, shape) with the given bytes, or random ones when `None`.
pub fn write_tensors(
    path: &Path,
    tensors: &[(&str, DType, &[u64])],
    bytes: Option<&[Vec<u8>]>,
    rng: &mut Rng,
) -> SlotTable {
    let table = SlotTable::new(
        tensors
            .iter()
            .map(|(n, d, s)| SlotInfo::new(*n, *d, s.to_vec()))
            .collect(),
    )
    .unwrap();
    let owned: Vec<Vec<u8>> = match bytes {
        Some(b) => b.to_vec(),
        None => table
            .slots()
            .iter()
            .map(|s| rng.bytes(s.nbytes() as usize))
            .collect(),
    };
    write_checkpoint(
        path,
        &table,
        &owned.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    )
    .unwrap();
    table
}
