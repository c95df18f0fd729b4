//! A sync made on a GPU, saved to files, applied with `deltacast apply` on a machine without
//! one: bit for bit. The files in tests/data/gpu-sync/ were captured on an H200 by
//! crates/deltacast-cuda/tests/gpu_frames.rs (`DELTACAST_GOLDEN_OUT`): a seed, then deltas
//! of several densities, some stages sent dense; `final.bin` is the host copy the GPU's
//! tensors were made from after the last step (every tensor's bytes, in table order).

use std::path::{Path, PathBuf};
use std::process::Command;

use deltacast::io::{write_checkpoint, Checkpoint};
use deltacast::{DType, SlotInfo, SlotTable};

/// The tensors of the captured sync (the GPU test's SHAPES).
const SHAPES: &[(&str, DType, &[u64])] = &[
    ("big", DType::BF16, &[3, 100_003]),
    ("empty", DType::BF16, &[0]),
    ("f16", DType::F16, &[4096, 3]),
    ("f32", DType::F32, &[12_289]),
    ("f8", DType::F8E4M3, &[8_195]),
    ("grid_edge", DType::BF16, &[4097]),
    ("odd", DType::BF16, &[7]),
    ("one", DType::BF16, &[1]),
];

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpu-sync")
}

fn deltacast(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_deltacast"))
        .args(args)
        .output()
        .expect("run deltacast");
    assert!(
        out.status.success(),
        "deltacast {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_gpu_made_sync_applies_bit_for_bit_with_deltacast_apply() {
    let dir = data();
    let mut syncs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (the golden GPU sync is part of the repository)",
                dir.display()
            )
        })
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "dcast"))
        .collect();
    syncs.sort_by_key(|p| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("sync-"))
            .and_then(|n| n.parse::<u32>().ok())
            .expect("files named sync-N.dcast")
    });
    assert!(syncs.len() >= 3, "a seed and deltas: {syncs:?}");
    let table = SlotTable::new(
        SHAPES
            .iter()
            .map(|(n, d, s)| SlotInfo::new(n.to_string(), *d, s.to_vec()))
            .collect(),
    )
    .expect("table");
    let tmp = tempfile::tempdir().expect("tempdir");
    // The seed applies onto any checkpoint of these tensors: zeros.
    let zeros: Vec<Vec<u8>> = table
        .slots()
        .iter()
        .map(|s| vec![0u8; s.nbytes() as usize])
        .collect();
    let zero_slices: Vec<&[u8]> = zeros.iter().map(Vec::as_slice).collect();
    let mut base = tmp.path().join("base.safetensors");
    write_checkpoint(&base, &table, &zero_slices).expect("base");
    let mut kinds = String::new();
    for (k, sync) in syncs.iter().enumerate() {
        kinds += &deltacast(&["inspect".as_ref(), sync.as_os_str()]);
        let out = tmp.path().join(format!("state-{k}.safetensors"));
        deltacast(&[
            "apply".as_ref(),
            base.as_os_str(),
            sync.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        base = out;
    }
    // What the GPU stages were: the seed, deltas, and dense stages among them.
    for kind in ["seed", "delta", "dense"] {
        assert!(kinds.contains(kind), "no {kind} frame in:\n{kinds}");
    }
    let want = std::fs::read(dir.join("final.bin")).expect("final.bin");
    let got = Checkpoint::open(&base).expect("final state");
    let mut at = 0;
    for (id, s) in table.slots().iter().enumerate() {
        let n = s.nbytes() as usize;
        assert_eq!(
            got.slot_bytes(id as u32),
            &want[at..at + n],
            "tensor `{}`",
            s.name
        );
        at += n;
    }
    assert_eq!(at, want.len(), "final.bin holds exactly the tensors");
}
