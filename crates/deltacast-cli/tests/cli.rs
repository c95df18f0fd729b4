//! The `deltacast` binary end to end: demo, and diff → apply through files, including the
//! recorded optimizer traces in crates/deltacast/tests/data/traces (every trace found there is
//! replayed; `DELTACAST_TRACES` names another folder).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use deltacast::io::{write_checkpoint, Checkpoint};
use deltacast::{DType, SlotInfo, SlotTable};
use safetensors::SafeTensors;

mod common;

use common::{bin, run_err, run_ok, tensors_of, write_tensors, Rng};

#[test]
fn demo_json_reports_every_step_with_matching_digests() {
    let out = run_ok(bin().args([
        "demo",
        "--preset",
        "tiny",
        "--steps",
        "3",
        "--json",
        "--codec",
        "abs32+raw",
    ]));
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 4);
    for (step, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], step as u64);
        assert_eq!(l["digest_ok"], true);
        for key in ["changed", "elements", "wire_bytes", "full_bytes", "sync_ms"] {
            assert!(l[key].is_number(), "missing {key}");
        }
    }
    // Deltas: abs32+raw costs 6 bytes per changed BF16 element plus under 1% of framing.
    for l in &lines[1..] {
        let changed = l["changed"].as_u64().unwrap();
        let wire = l["wire_bytes"].as_u64().unwrap();
        assert!(changed > 0);
        assert!(wire >= changed * 6, "{wire} < {}", changed * 6);
        assert!(
            (wire as f64) <= changed as f64 * 6.0 * 1.01 + 8192.0,
            "framing overhead too large: {wire} for {changed}"
        );
    }
}

#[test]
fn demo_rejects_bad_options_clearly() {
    assert!(run_err(bin().args(["demo", "--preset", "nope"])).contains("unknown preset"));
    assert!(
        run_err(bin().args(["demo", "--preset", "tiny", "--codec", "zip+raw"]))
            .contains("unknown codec")
    );
    assert!(
        run_err(bin().args(["demo", "--preset", "tiny", "--bucket-size", "10"]))
            .contains("bucket size")
    );
}

/// Writes a checkpoint of random BF16/F32 tensors.
fn write_random(path: &Path, seed: u64) -> SlotTable {
    let table = SlotTable::new(vec![
        SlotInfo::new("a.weight", DType::BF16, vec![300, 7]),
        SlotInfo::new("b.bias", DType::F32, vec![33]),
        SlotInfo::new("c.empty", DType::F16, vec![0, 4]),
    ])
    .unwrap();
    let mut x = seed;
    let bufs: Vec<Vec<u8>> = table
        .slots()
        .iter()
        .map(|s| {
            (0..s.nbytes())
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect()
        })
        .collect();
    write_checkpoint(
        path,
        &table,
        &bufs.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    )
    .unwrap();
    table
}

#[test]
fn diff_apply_inspect_round_trip_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new, d, out) = (
        dir.path().join("old.safetensors"),
        dir.path().join("new.safetensors"),
        dir.path().join("d.dcast"),
        dir.path().join("out.safetensors"),
    );
    write_random(&old, 1);
    // NEW = OLD with a few changes.
    let mut bufs = tensors_of(&old);
    bufs[0][10] ^= 1;
    bufs[0][4000] ^= 0x80;
    bufs[1][0] ^= 0xff;
    let table = Checkpoint::open(&old).unwrap().table().clone();
    write_checkpoint(
        &new,
        &table,
        &bufs.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    )
    .unwrap();

    let line = run_ok(
        bin()
            .args(["diff"])
            .arg(&old)
            .arg(&new)
            .arg("-o")
            .arg(&d)
            .arg("--json"),
    );
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["changed"], 3);
    run_ok(bin().args(["apply"]).arg(&old).arg(&d).arg("-o").arg(&out));
    assert_eq!(tensors_of(&out), tensors_of(&new));
    let summary = run_ok(bin().args(["inspect"]).arg(&d));
    assert!(
        summary.contains("delta version 1") && summary.contains("3 changes"),
        "{summary}"
    );

    // Applying to the wrong base is refused and writes nothing.
    let wrong_out = dir.path().join("wrong.safetensors");
    let err = run_err(
        bin()
            .args(["apply"])
            .arg(&new)
            .arg(&d)
            .arg("-o")
            .arg(&wrong_out),
    );
    assert!(
        err.contains("not the checkpoint this delta was made from"),
        "{err}"
    );
    assert!(!wrong_out.exists());
    // A checkpoint with other tensors: wrong slot table.
    let other = dir.path().join("other.safetensors");
    let t = SlotTable::new(vec![SlotInfo::new("z", DType::F32, vec![2])]).unwrap();
    write_checkpoint(&other, &t, &[&[0u8; 8]]).unwrap();
    assert!(run_err(
        bin()
            .args(["apply"])
            .arg(&other)
            .arg(&d)
            .arg("-o")
            .arg(&wrong_out)
    )
    .contains("another set of tensors"));
    assert!(!wrong_out.exists());
    // A truncated or corrupted delta file: error, existing OUT untouched.
    let good_out = std::fs::read(&out).unwrap();
    let bytes = std::fs::read(&d).unwrap();
    for cut in [0, 10, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&d, &bytes[..cut]).unwrap();
        run_err(bin().args(["apply"]).arg(&old).arg(&d).arg("-o").arg(&out));
        assert_eq!(std::fs::read(&out).unwrap(), good_out);
    }
    let mut flipped = bytes.clone();
    flipped[bytes.len() / 3] ^= 4;
    std::fs::write(&d, &flipped).unwrap();
    assert!(
        run_err(bin().args(["apply"]).arg(&old).arg(&d).arg("-o").arg(&out)).contains("checksum")
    );
    assert_eq!(std::fs::read(&out).unwrap(), good_out);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left behind");
    // Missing files name themselves.
    std::fs::write(&d, &bytes).unwrap();
    assert!(run_err(
        bin()
            .args(["apply", "/nonexistent/base.safetensors"])
            .arg(&d)
            .arg("-o")
            .arg(&out)
    )
    .contains("nonexistent"));
}

/// Where the recorded traces live: $DELTACAST_TRACES, else the ones committed with the core
/// crate.
fn traces_dir() -> PathBuf {
    std::env::var_os("DELTACAST_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deltacast/tests/data/traces")
        })
}

/// Every (trace, base) pair in the traces directory.
fn trace_pairs() -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(traces_dir()) else {
        return Vec::new();
    };
    let mut pairs: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "safetensors")
                && !p.to_string_lossy().ends_with("_base.safetensors")
        })
        .filter_map(|p| {
            let base = PathBuf::from(
                p.to_string_lossy()
                    .replace(".safetensors", "_base.safetensors"),
            );
            base.exists().then_some((p, base))
        })
        .collect();
    pairs.sort();
    pairs
}

/// Rebuilds the checkpoints of a trace: the base, then each step's (idx, val) applied in order.
fn rebuild_checkpoints(trace: &Path, base: &Path, dir: &Path) -> Vec<PathBuf> {
    let base_bytes = std::fs::read(base).unwrap();
    let base_st = SafeTensors::deserialize(&base_bytes).unwrap();
    let mut params: BTreeMap<String, (DType, Vec<u64>, Vec<u8>)> = BTreeMap::new();
    for (name, view) in base_st.tensors() {
        let param = name
            .strip_prefix("base::")
            .expect("base:: prefix")
            .to_string();
        let dtype = DType::from_name(&format!("{:?}", view.dtype())).unwrap();
        params.insert(
            param,
            (
                dtype,
                view.shape().iter().map(|&d| d as u64).collect(),
                view.data().to_vec(),
            ),
        );
    }
    let trace_bytes = std::fs::read(trace).unwrap();
    let st = SafeTensors::deserialize(&trace_bytes).unwrap();
    let mut steps: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for name in st.names() {
        if let Some(rest) = name.strip_prefix("step") {
            let (k, tail) = rest.split_once("::").unwrap();
            if let Some(param) = tail.strip_suffix("::idx") {
                steps
                    .entry(k.parse().unwrap())
                    .or_default()
                    .push(param.to_string());
            }
        }
    }
    let table = SlotTable::new(
        params
            .iter()
            .map(|(n, (d, s, _))| SlotInfo::new(n.clone(), *d, s.clone()))
            .collect(),
    )
    .unwrap();
    let save = |params: &BTreeMap<String, (DType, Vec<u64>, Vec<u8>)>, path: &Path| {
        write_checkpoint(
            path,
            &table,
            &params.values().map(|p| p.2.as_slice()).collect::<Vec<_>>(),
        )
        .unwrap();
    };
    let mut paths = vec![dir.join("step0.safetensors")];
    save(&params, &paths[0]);
    for (k, names) in &steps {
        for param in names {
            let idx = st.tensor(&format!("step{k}::{param}::idx")).unwrap();
            let val = st.tensor(&format!("step{k}::{param}::val")).unwrap();
            let entry = params.get_mut(param).unwrap();
            let w = entry.0.width();
            for (i, chunk) in idx.data().chunks_exact(4).enumerate() {
                let at = i32::from_le_bytes(chunk.try_into().unwrap()) as usize * w;
                entry.2[at..at + w].copy_from_slice(&val.data()[i * w..(i + 1) * w]);
            }
        }
        let path = dir.join(format!("step{k}.safetensors"));
        save(&params, &path);
        paths.push(path);
    }
    paths
}

#[test]
fn recorded_traces_replay_bit_for_bit_through_diff_and_apply() {
    let pairs = trace_pairs();
    assert!(
        !pairs.is_empty(),
        "no recorded traces (NAME.safetensors + NAME_base.safetensors) in {}",
        traces_dir().display()
    );
    for (trace, base) in pairs {
        let dir = tempfile::tempdir().unwrap();
        let checkpoints = rebuild_checkpoints(&trace, &base, dir.path());
        assert!(checkpoints.len() >= 2, "{}: no steps", trace.display());
        for (k, pair) in checkpoints.windows(2).enumerate() {
            let d = dir.path().join(format!("d{k}.dcast"));
            let out = dir.path().join(format!("out{k}.safetensors"));
            run_ok(
                bin()
                    .arg("diff")
                    .arg(&pair[0])
                    .arg(&pair[1])
                    .arg("-o")
                    .arg(&d)
                    .args(["--version", &(k + 1).to_string()]),
            );
            run_ok(bin().arg("apply").arg(&pair[0]).arg(&d).arg("-o").arg(&out));
            assert_eq!(
                tensors_of(&out),
                tensors_of(&pair[1]),
                "{}: step {} differs",
                trace.display(),
                k + 1
            );
        }
        eprintln!(
            "{}: {} steps replayed bit for bit",
            trace.display(),
            checkpoints.len() - 1
        );
    }
}

#[test]
fn gpu_report_tables_and_draws_the_committed_gpu_results() {
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/data/gpu-sync/entropy-codecs");
    let files: Vec<PathBuf> = ["gpu_sync_0.5b_nvlink.json", "gpu_sync_7b_socket.json"]
        .iter()
        .map(|f| data.join(f))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let png = dir.path().join("gpu.png");
    let out = run_ok(bin().arg("gpu-report").args(&files).arg("--out").arg(&png));
    // The ratios printed are the JSON's medians divided, independently recomputed here.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[1]).unwrap()).unwrap();
    let ms = |m: &str| v["summary"][m]["median_ms"].as_f64().unwrap();
    let ratio = format!("{:.1}x", ms("full") / ms("deltacast"));
    let line = out
        .lines()
        .find(|l| l.starts_with("7b socket"))
        .expect("7b row");
    assert!(line.contains(&ratio), "{line} lacks {ratio}");
    let bytes = std::fs::read(&png).expect("png written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 10_000);
    // A file that is not a passing GPU bench result is refused with its name.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"ok": false}"#).unwrap();
    let err = run_err(bin().arg("gpu-report").arg(&bad));
    assert!(
        err.contains("bad.json") && err.contains("did not pass"),
        "{err}"
    );
    std::fs::write(&bad, r#"{"ok": true, "summary": {}}"#).unwrap();
    let err = run_err(bin().arg("gpu-report").arg(&bad));
    assert!(err.contains("/summary/full/median_ms"), "{err}");
    // The sharded bench's results: their own two methods, the ratio recomputed here.
    let sharded = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/data/gpu-sharded/early-return/gpu_sharded_7b_socket.json");
    let out = run_ok(bin().arg("gpu-report").arg(&sharded));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sharded).unwrap()).unwrap();
    let ratio = v["median_whole_ms"].as_f64().unwrap() / v["median_deltacast_ms"].as_f64().unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with("7b socket"))
        .expect("7b row");
    assert!(
        line.contains(&format!("{ratio:.1}x")),
        "{line} lacks {ratio:.1}x"
    );
    assert!(out.starts_with("run") && out.contains("whole ms"), "{out}");
    // One report per bench: results of the two benches together are refused.
    let err = run_err(bin().arg("gpu-report").arg(&files[0]).arg(&sharded));
    assert!(err.contains("different benches"), "{err}");
    // A CUDA-IPC run (two processes on one GPU): its own legend, its place in the label,
    // and not mixed with NCCL runs.
    let ipc = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/data/gpu-sync/ipc-one-gpu/gpu_sync_0.5b_ipc_onegpu.json");
    let out = run_ok(bin().arg("gpu-report").arg(&ipc));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ipc).unwrap()).unwrap();
    let ms = |m: &str| v["summary"][m]["median_ms"].as_f64().unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with("0.5b ipc 1 GPU"))
        .expect("0.5b ipc row");
    let ratio = format!("{:.1}x", ms("plain") / ms("deltacast"));
    assert!(line.contains(&ratio), "{line} lacks {ratio}");
    let err = run_err(bin().arg("gpu-report").arg(&files[0]).arg(&ipc));
    assert!(err.contains("CUDA-IPC"), "{err}");
}

/// The tensors of the integer round trip: every non-float dtype, odd and empty shapes, and a
/// float tensor beside them.
const INT_TENSORS: &[(&str, DType, &[u64])] = &[
    ("bf16.w", DType::BF16, &[33, 3]),
    ("bool.mask", DType::Bool, &[9, 7]),
    ("f64.scale", DType::F64, &[5]),
    ("i16.empty", DType::I16, &[0, 3]),
    ("i32.ids", DType::I32, &[5, 3]),
    ("i64.step", DType::I64, &[]),
    ("i64.table", DType::I64, &[301]),
    ("i8.q", DType::I8, &[1]),
    ("u16.codes", DType::U16, &[17]),
    ("u32.hist", DType::U32, &[2, 2]),
    ("u64.seen", DType::U64, &[3]),
    ("u8.bytes", DType::U8, &[13]),
    ("u8.empty", DType::U8, &[0]),
];

/// `old` with each element changed with probability `density`: a new random pattern, or for
/// 8-byte elements often only one of their two words, or a `+1` (a step counter).
fn mutate_elements(rng: &mut Rng, old: &[u8], dtype: DType, density: f64) -> Vec<u8> {
    let size = dtype.element_size();
    let mut new = old.to_vec();
    for e in new.chunks_exact_mut(size) {
        if (rng.next() % 1_000_000) as f64 >= density * 1e6 {
            continue;
        }
        match (rng.next() % 4, size) {
            (0, 8) => e[..4].copy_from_slice(&rng.bytes(4)),
            (1, 8) => e[4..].copy_from_slice(&rng.bytes(4)),
            (2, 8) => {
                let v = u64::from_le_bytes(e.try_into().unwrap()).wrapping_add(1);
                e.copy_from_slice(&v.to_le_bytes());
            }
            _ if dtype == DType::Bool => e[0] ^= 1,
            _ => e.copy_from_slice(&rng.bytes(size)),
        }
    }
    new
}

#[test]
fn integer_and_bool_tensors_round_trip_bit_exact_with_raw_values() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    for (seed, density, codec) in [
        (1u64, 0.02, "auto"),
        (2, 0.3, "auto"),
        (3, 1.0, "auto"),
        (4, 0.0, "auto"),
        (5, 0.5, "gaps+ulp"),
        (6, 0.1, "bitmap+ulp"),
        (7, 0.5, "steps+esc"),
    ] {
        let mut rng = Rng(seed);
        let table = write_tensors(&p("old.safetensors"), INT_TENSORS, None, &mut rng);
        let old = tensors_of(&p("old.safetensors"));
        let mut bool_old = old.clone();
        for (s, b) in table.slots().iter().zip(&mut bool_old) {
            if s.dtype == DType::Bool {
                b.iter_mut().for_each(|x| *x &= 1);
            }
        }
        write_tensors(
            &p("old.safetensors"),
            INT_TENSORS,
            Some(&bool_old),
            &mut rng,
        );
        let new: Vec<Vec<u8>> = table
            .slots()
            .iter()
            .zip(&bool_old)
            .map(|(s, b)| mutate_elements(&mut rng, b, s.dtype, density))
            .collect();
        write_tensors(&p("new.safetensors"), INT_TENSORS, Some(&new), &mut rng);
        // Oracle: changed sync words (4 bytes for 8-byte dtypes, the element otherwise).
        let changed: usize = table
            .slots()
            .iter()
            .zip(bool_old.iter().zip(&new))
            .map(|(s, (a, b))| {
                let w = s.dtype.width();
                a.chunks(w).zip(b.chunks(w)).filter(|(x, y)| x != y).count()
            })
            .sum();
        let d = p("d.dcast");
        let line = run_ok(
            bin()
                .arg("diff")
                .arg(p("old.safetensors"))
                .arg(p("new.safetensors"))
                .arg("-o")
                .arg(&d)
                .args([
                    "--json",
                    "--codec",
                    codec,
                    "--bucket-size",
                    "4K",
                    "--chunk-elems",
                    "64",
                ]),
        );
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(v["changed"], changed as u64, "seed {seed}");
        run_ok(
            bin()
                .arg("apply")
                .arg(p("old.safetensors"))
                .arg(&d)
                .arg("-o")
                .arg(p("out.safetensors")),
        );
        assert_eq!(tensors_of(&p("out.safetensors")), new, "seed {seed}");
        // Only the float tensor may carry ulp values.
        let listing = run_ok(
            bin()
                .arg("inspect")
                .arg(&d)
                .args(["--chunks", "--json", "--names"])
                .arg(p("old.safetensors")),
        );
        let mut chunks = 0;
        for l in listing.lines() {
            let c: serde_json::Value = serde_json::from_str(l).unwrap();
            let Some(name) = c["tensor"].as_str() else {
                continue;
            };
            chunks += 1;
            let slot = table.slots().iter().find(|s| s.name == name).unwrap();
            let codec = c["codec"].as_str().unwrap();
            if !slot.dtype.ulp_codable() {
                assert!(codec.ends_with("+raw"), "{name} ({}): {codec}", slot.dtype);
            }
        }
        assert_eq!(chunks > 0, changed > 0, "seed {seed}");
    }
}

#[test]
fn stats_reports_every_step_of_the_recorded_trace_against_the_bound() {
    let pairs = trace_pairs();
    assert!(
        !pairs.is_empty(),
        "no recorded traces in {}",
        traces_dir().display()
    );
    let (trace, base) = &pairs[0];
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = rebuild_checkpoints(trace, base, dir.path());
    // `stats` on the same trace: one row per step and a total, the bound named where defined.
    let out = run_ok(
        bin()
            .arg("stats")
            .arg("--trace")
            .arg(trace)
            .arg("--base")
            .arg(base),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "codec auto; bound = Σ n·H(k/n) + k·H(ULP step) (iid), context = the same given the old exponent class, as defined in docs/codecs.md"
    );
    assert_eq!(lines.len(), 2 + (checkpoints.len() - 1) + 1, "{out}");
    assert!(
        lines[lines.len() - 1].starts_with(&format!("total over {} steps:", checkpoints.len() - 1)),
        "{out}"
    );
    // Issue 28's acceptance: with the context codecs, whole frames of the trace at most 0.75×
    // the iid bound and 0.15× int32 positions + raw values, and above the context bound.
    let json = run_ok(
        bin()
            .args(["stats", "--json", "--codec", "auto+ctx", "--trace"])
            .arg(trace)
            .arg("--base")
            .arg(base),
    );
    let total: serde_json::Value =
        serde_json::from_str(json.lines().last().expect("a total line")).unwrap();
    let ratio = |k: &str| {
        total[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {total}"))
    };
    assert!(ratio("chosen_over_bound") <= 0.75, "{total}");
    assert!(ratio("chosen_over_abs32_raw") <= 0.15, "{total}");
    assert!(ratio("chosen_over_context_bound") >= 1.0, "{total}");
}
