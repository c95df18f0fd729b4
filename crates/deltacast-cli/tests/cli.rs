//! The `deltacast` binary end to end: demo, and diff → apply through files, including the
//! recorded optimizer trace in crates/deltacast/tests/data/traces; and what the binary says
//! (errors, help, counts, sizes, hashes) checked word for word.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use deltacast::io::{write_checkpoint, Checkpoint};
use deltacast::{DType, SlotInfo, SlotTable};
use safetensors::SafeTensors;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deltacast"))
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("binary runs");
    assert!(
        out.status.success(),
        "command failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().expect("binary runs");
    assert!(
        !out.status.success(),
        "command should have failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

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

fn tensors_of(path: &Path) -> Vec<Vec<u8>> {
    Checkpoint::open(path).unwrap().to_buffers()
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

/// The recorded trace in the repository (the base, then 8 AdamW steps of a small Qwen2 model).
fn recorded_trace() -> (PathBuf, PathBuf) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deltacast/tests/data/traces");
    let trace = dir.join("trace_dense_lr1e-06.safetensors");
    let base = dir.join("trace_dense_lr1e-06_base.safetensors");
    for p in [&trace, &base] {
        assert!(p.is_file(), "the recorded trace {} is missing", p.display());
    }
    (trace, base)
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
fn recorded_trace_replays_bit_for_bit_through_diff_and_apply() {
    let (trace, base) = recorded_trace();
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
    // `stats` on the same trace: one row per step and a total, the bound named where defined.
    let out = run_ok(
        bin()
            .arg("stats")
            .arg("--trace")
            .arg(&trace)
            .arg("--base")
            .arg(&base),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        "codec auto; bound = Σ n·H(k/n) + k·H(ULP step), as defined in docs/codecs.md"
    );
    assert_eq!(lines.len(), 2 + (checkpoints.len() - 1) + 1, "{out}");
    assert!(
        lines[lines.len() - 1].starts_with(&format!("total over {} steps:", checkpoints.len() - 1)),
        "{out}"
    );
}

#[test]
fn gpu_report_tables_and_draws_the_committed_gpu_results() {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/data/gpu-2026-11-29/entropy");
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
        .join("../../docs/data/gpu-2026-11-30-tenth/sharded-bench/gpu_sharded_7b_socket.json");
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
    let ipc = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "../../docs/data/gpu-2026-11-30-eleventh/one-gpu/bench/gpu_sync_0.5b_ipc_onegpu.json",
    );
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

// ---------------------------------------------------------------------------------------------
// What the binary says.

/// A small deterministic generator (splitmix64), independent of the code under test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Writes `tensors` (name, dtype, shape) with the given bytes, or random ones when `None`.
fn write_tensors(
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

fn stderr_of(cmd: &mut Command) -> String {
    run_err(cmd)
}

#[test]
fn errors_are_said_once_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let mut rng = Rng(7);
    write_tensors(
        &p("ok.safetensors"),
        &[("a", DType::F32, &[4])],
        None,
        &mut rng,
    );
    // An 8-byte header length far beyond any limit.
    std::fs::write(
        p("bad.safetensors"),
        [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, b'{'],
    )
    .unwrap();
    std::fs::write(p("junk.dcast"), b"not a sync file at all, just text").unwrap();
    let nope = p("nope.safetensors");
    let enoent = "No such file or directory (os error 2)";
    let out = p("out");
    let cases: Vec<(Vec<std::ffi::OsString>, String)> = vec![
        (
            vec![
                "diff".into(),
                nope.clone().into(),
                p("ok.safetensors").into(),
                "-o".into(),
                out.clone().into(),
            ],
            format!("cannot open OLD {}: {enoent}", nope.display()),
        ),
        (
            vec![
                "diff".into(),
                p("ok.safetensors").into(),
                p("bad.safetensors").into(),
                "-o".into(),
                out.clone().into(),
            ],
            format!(
                "cannot open NEW {}: not a valid safetensors file: header too large",
                p("bad.safetensors").display()
            ),
        ),
        (
            vec![
                "apply".into(),
                p("ok.safetensors").into(),
                p("none.dcast").into(),
                "-o".into(),
                out.clone().into(),
            ],
            format!("cannot read {}: {enoent}", p("none.dcast").display()),
        ),
        (
            vec!["inspect".into(), p("none.dcast").into()],
            format!("cannot read {}: {enoent}", p("none.dcast").display()),
        ),
        (
            vec![
                "stats".into(),
                p("ok.safetensors").into(),
                nope.clone().into(),
            ],
            format!("cannot open NEW {}: {enoent}", nope.display()),
        ),
        (
            vec![
                "stats".into(),
                "--trace".into(),
                nope.clone().into(),
                "--base".into(),
                nope.clone().into(),
            ],
            format!("cannot read {}: {enoent}", nope.display()),
        ),
        (
            vec!["gpu-report".into(), nope.clone().into()],
            String::new(),
        ),
        (
            vec![
                "apply".into(),
                p("ok.safetensors").into(),
                p("junk.dcast").into(),
                "-o".into(),
                out.clone().into(),
            ],
            String::new(),
        ),
    ];
    for (args, expected) in cases {
        let err = stderr_of(bin().args(&args));
        let line = err.trim_end();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        let message = line
            .strip_prefix("deltacast: error: ")
            .unwrap_or_else(|| panic!("{args:?}: {err}"));
        if !expected.is_empty() {
            assert_eq!(message, expected, "{args:?}");
        }
        // Whatever the command, no part of the message is said twice.
        let parts: Vec<&str> = message.split(": ").collect();
        for (i, a) in parts.iter().enumerate() {
            assert!(!parts[i + 1..].contains(a), "`{a}` said twice: {message}");
        }
        assert!(!out.exists());
    }
}

#[test]
fn diff_names_what_differs_between_old_and_new() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (
        dir.path().join("old.safetensors"),
        dir.path().join("new.safetensors"),
    );
    let mut rng = Rng(11);
    write_tensors(
        &old,
        &[
            ("a", DType::BF16, &[4]),
            ("b", DType::F32, &[3]),
            ("c", DType::I64, &[2]),
            ("same", DType::U8, &[5]),
        ],
        None,
        &mut rng,
    );
    write_tensors(
        &new,
        &[
            ("a", DType::F16, &[4]),
            ("b", DType::F32, &[3, 1]),
            ("extra", DType::F32, &[1]),
            ("same", DType::U8, &[5]),
        ],
        None,
        &mut rng,
    );
    let expected = "deltacast: error: OLD and NEW hold different tensors (a sync needs the same \
                    names, dtypes and shapes):\n  \
                    `a` is BF16 [4] in OLD, F16 [4] in NEW\n  \
                    `b` is F32 [3] in OLD, F32 [3, 1] in NEW\n  \
                    OLD has `c` (I64 [2]), NEW does not\n  \
                    NEW has `extra` (F32 [1]), OLD does not\n";
    let out = dir.path().join("d.dcast");
    let err = run_err(bin().arg("diff").arg(&old).arg(&new).arg("-o").arg(&out));
    assert_eq!(err, expected);
    assert!(!out.exists());
    // `stats` refuses the same pair with the same words; swapped, the roles swap.
    assert_eq!(run_err(bin().arg("stats").arg(&old).arg(&new)), expected);
    let err = run_err(bin().arg("diff").arg(&new).arg(&old).arg("-o").arg(&out));
    assert!(
        err.contains("\n  NEW has `c` (I64 [2]), OLD does not\n"),
        "{err}"
    );
    assert!(
        err.contains("\n  OLD has `extra` (F32 [1]), NEW does not\n"),
        "{err}"
    );
    assert!(
        err.contains("\n  `a` is F16 [4] in OLD, BF16 [4] in NEW\n"),
        "{err}"
    );
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

/// Every subcommand, hidden ones included, as argument lists.
fn subcommands() -> Vec<Vec<String>> {
    let help = run_ok(bin().arg("--help"));
    let mut out: Vec<Vec<String>> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(|c| vec![c.to_string()])
        .collect();
    assert!(out.len() >= 8, "{help}");
    for hidden in ["worker", "bench-worker"] {
        for role in ["trainer", "receiver"] {
            out.push(vec![hidden.to_string(), role.to_string()]);
        }
    }
    out
}

/// The entries of the `Arguments:` and `Options:` sections of a help text that have no help
/// line (clap puts it on the entry's line or, when wide, on the next, indented).
fn undocumented(help: &str) -> Vec<String> {
    let lines: Vec<&str> = help.lines().collect();
    let mut missing = Vec::new();
    let mut in_section = false;
    for (i, l) in lines.iter().enumerate() {
        if !l.starts_with(' ') {
            in_section = matches!(*l, "Arguments:" | "Options:");
            continue;
        }
        let entry = l.strip_prefix("  ").unwrap_or(l);
        if !in_section || !entry.starts_with(['-', '<', '[']) {
            continue;
        }
        let same_line = entry
            .split_once("  ")
            .is_some_and(|(_, h)| !h.trim().is_empty());
        let next_line = lines
            .get(i + 1)
            .is_some_and(|n| n.starts_with("        ") && !n.trim().is_empty());
        if !same_line && !next_line {
            missing.push(entry.trim().to_string());
        }
    }
    missing
}

#[test]
fn every_argument_of_every_subcommand_has_a_help_line() {
    assert_eq!(undocumented("Options:\n  -o <X>\n  --a  yes\n"), ["-o <X>"]);
    for cmd in subcommands() {
        for flag in ["-h", "--help"] {
            let help = run_ok(bin().args(&cmd).arg(flag));
            assert!(help.contains("Options:"), "{cmd:?}: {help}");
            let missing = undocumented(&help);
            assert!(
                missing.is_empty(),
                "{cmd:?} {flag}: no help for {missing:?}\n{help}"
            );
            // The repository stands on its own: no pointer outside it.
            for outside in ["DESIGN.md", "shared/", "../"] {
                assert!(
                    !help.contains(outside),
                    "{cmd:?} {flag} mentions {outside}:\n{help}"
                );
            }
        }
    }
    let stats = run_ok(bin().args(["stats", "--help"]));
    assert!(
        stats.contains("crates/deltacast/tests/data/traces/"),
        "{stats}"
    );
    assert!(stats.contains("docs/codecs.md"), "{stats}");
    let inspect = run_ok(bin().args(["inspect", "--help"]));
    assert!(inspect.contains("START..END (END excluded"), "{inspect}");
}

#[test]
fn counts_agree_with_their_nouns_and_hashes_are_hex() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let mut rng = Rng(3);
    let table = write_tensors(
        &p("old.safetensors"),
        &[("w", DType::F32, &[10])],
        None,
        &mut rng,
    );
    let mut bufs = tensors_of(&p("old.safetensors"));
    bufs[0][8] ^= 0x40;
    write_tensors(
        &p("new.safetensors"),
        &[("w", DType::F32, &[10])],
        Some(&bufs),
        &mut rng,
    );
    let d = p("d.dcast");
    let line = run_ok(
        bin()
            .arg("diff")
            .arg(p("old.safetensors"))
            .arg(p("new.safetensors"))
            .arg("-o")
            .arg(&d),
    );
    assert!(
        line.contains(": version 1 delta, 1 of 10 elements changed (10.000%), "),
        "{line}"
    );
    assert!(line.contains(" full (4.2x larger), 1 flush, "), "{line}");
    let line = run_ok(
        bin()
            .arg("apply")
            .arg(p("old.safetensors"))
            .arg(&d)
            .arg("-o")
            .arg(p("o")),
    );
    assert!(
        line.contains(" (1 element changed, 1 flush), digest "),
        "{line}"
    );
    let hash = format!("{:016x}", table.hash());
    let text = run_ok(bin().arg("inspect").arg(&d));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_once(", ").map(|(a, _)| a),
        Some("frame 0: delta version 1 flush 0 (final) — 1 chunk"),
        "{text}"
    );
    assert!(lines[0].contains(", 1 digest, "), "{text}");
    assert!(lines[0].ends_with(&format!("slot table {hash}")), "{text}");
    assert!(
        lines[1].starts_with("total: 1 frame, 1 chunk, 1 change, "),
        "{text}"
    );
    assert!(
        lines[2].contains(" 1 chunk ") && lines[2].contains(" 1 change "),
        "{text}"
    );
    // The same spelling in JSON and in the refusal of a BASE with other tensors.
    let json = run_ok(bin().arg("inspect").arg(&d).arg("--json"));
    let first: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(first["slot_table"], hash.as_str());
    let v: serde_json::Value = serde_json::from_str(
        run_ok(
            bin()
                .arg("diff")
                .arg(p("old.safetensors"))
                .arg(p("new.safetensors"))
                .arg("-o")
                .arg(&d)
                .arg("--json"),
        )
        .trim(),
    )
    .unwrap();
    assert_eq!(v["slot_table"], hash.as_str());
    let other = write_tensors(
        &p("other.safetensors"),
        &[("v", DType::F32, &[10])],
        None,
        &mut rng,
    );
    let err = run_err(
        bin()
            .arg("apply")
            .arg(p("other.safetensors"))
            .arg(&d)
            .arg("-o")
            .arg(p("o2")),
    );
    assert!(
        err.contains(&format!("(slot table {hash}) than BASE"))
            && err.contains(&format!("({:016x})", other.hash())),
        "{err}"
    );
}

#[test]
fn inspect_chunks_names_tensors_and_aligns_columns() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let mut rng = Rng(5);
    let tensors: &[(&str, DType, &[u64])] = &[
        ("a", DType::BF16, &[5000]),
        ("model.layers.0.mlp.down_proj.weight", DType::F32, &[70]),
        ("step", DType::I64, &[]),
    ];
    write_tensors(&p("old.safetensors"), tensors, None, &mut rng);
    let new: Vec<Vec<u8>> = tensors_of(&p("old.safetensors"))
        .iter()
        .map(|b| b.iter().map(|x| x ^ 1).collect())
        .collect();
    write_tensors(&p("new.safetensors"), tensors, Some(&new), &mut rng);
    let d = p("d.dcast");
    run_ok(
        bin()
            .arg("diff")
            .arg(p("old.safetensors"))
            .arg(p("new.safetensors"))
            .arg("-o")
            .arg(&d)
            .args(["--chunk-elems", "1024"]),
    );
    let text = run_ok(
        bin()
            .arg("inspect")
            .arg(&d)
            .arg("--chunks")
            .arg("--names")
            .arg(p("new.safetensors")),
    );
    let header = text.lines().nth(1).unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["slot", "tensor", "elements", "changes", "codecs", "pos", "bytes", "val", "bytes"],
        "{text}"
    );
    let rows: Vec<&str> = text
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .collect();
    // 5 chunks of `a`, 1 of the F32 tensor, 1 of `step` (two words).
    assert_eq!(rows.len(), 7, "{text}");
    assert!(
        rows[0].contains(" a ") && rows[0].contains(" 0..1024 "),
        "{text}"
    );
    assert!(rows[4].contains(" 4096..5000 "), "{text}");
    assert!(
        rows[6].contains(" step ") && rows[6].contains(" 0..2 "),
        "{text}"
    );
    // Every column starts where its header does.
    let starts = |l: &str| -> Vec<usize> {
        l.char_indices()
            .filter(|&(i, c)| c != ' ' && (i == 0 || l.as_bytes()[i - 1] == b' '))
            .map(|(i, _)| i)
            .collect()
    };
    let h = starts(header);
    for r in &rows {
        let s = starts(r);
        assert_eq!(s.len(), 7, "{r}");
        // Left-aligned columns (tensor, elements, codecs) start with their header; numbers end
        // with theirs.
        assert_eq!([s[1], s[2], s[4]], [h[1], h[2], h[4]], "\n{header}\n{r}");
    }
    assert!(!text.contains("--names CHECKPOINT names"), "{text}");
    // Without --names: slot ids, and a pointer to the option.
    let text = run_ok(bin().arg("inspect").arg(&d).arg("--chunks"));
    assert!(
        text.contains("(slots by id; --names CHECKPOINT names their tensors)"),
        "{text}"
    );
    assert!(!text.contains(" step "), "{text}");
    // A checkpoint with other tensors cannot name them.
    write_tensors(
        &p("other.safetensors"),
        &[("x", DType::F32, &[1])],
        None,
        &mut rng,
    );
    let err = run_err(
        bin()
            .arg("inspect")
            .arg(&d)
            .arg("--chunks")
            .arg("--names")
            .arg(p("other.safetensors")),
    );
    assert!(err.contains("holds other tensors"), "{err}");
}

#[test]
fn sizes_show_as_written_and_long_phases_say_what_happens() {
    for (given, shown) in [
        ("512M", "bucket 512 MiB"),
        ("1536K", "bucket 1536 KiB"),
        ("65536", "bucket 65536 B"),
    ] {
        let out = bin()
            .args([
                "demo",
                "--preset",
                "tiny",
                "--steps",
                "1",
                "--receivers",
                "1",
                "--bucket-size",
                given,
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        let stdout = String::from_utf8(out.stdout).unwrap();
        let first = stdout.lines().next().unwrap();
        assert!(
            first.contains(&format!(", {shown}")) && first.contains("1 receiver,"),
            "{first}"
        );
        // Not a terminal: one line per long phase on stderr.
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert_eq!(
            stderr, "seeding 1 receiver…\nrecomputing every receiver's digests…\n",
            "{stderr}"
        );
    }
    // JSON: stdout is JSON only, and stderr stays quiet.
    let out = bin()
        .args(["demo", "--preset", "tiny", "--steps", "1", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for l in String::from_utf8(out.stdout).unwrap().lines() {
        serde_json::from_str::<serde_json::Value>(l).expect("only JSON on stdout");
    }
}
