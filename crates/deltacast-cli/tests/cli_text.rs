//! What the `deltacast` binary says, word for word: errors (each said once), tensor
//! differences, help lines, counts, sizes, hashes, the `inspect --chunks` table and progress.

use deltacast::DType;

mod common;

use common::{bin, run_err, run_ok, tensors_of, write_tensors, Rng};

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
        let err = run_err(bin().args(&args));
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
