//! `deltacast bench`: trainer ranks and receivers in their own network namespaces over tc-shaped
//! veth links. A short run (tiny model, one link, two steps) must verify every step, write its
//! results and plot, and leave no namespace or link behind — also when interrupted with SIGINT
//! midway. The shaped tests need root and iproute2 and skip with a message where those are
//! missing; the loopback run needs neither.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deltacast"))
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts")
}

/// Waits for `child` and collects its output; after `limit`, interrupts it (so it tears down),
/// then kills it and fails.
fn finish(mut child: Child, limit: Duration) -> Output {
    let started = Instant::now();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let err_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if started.elapsed() > limit {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            std::thread::sleep(Duration::from_secs(5));
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
    }
}

fn run_within(cmd: &mut Command, limit: Duration) -> Output {
    finish(spawn(cmd), limit)
}

/// Why shaped runs cannot be tested here, if they cannot.
fn cannot_shape() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root".into());
    }
    for tool in ["ip", "tc"] {
        if !Command::new(tool)
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(format!("`{tool}` (iproute2) is missing"));
        }
    }
    let probe = format!("dcb-{}-probe", std::process::id());
    let made = Command::new("ip")
        .args(["netns", "add", &probe])
        .output()
        .is_ok_and(|o| o.status.success());
    let _ = Command::new("ip").args(["netns", "del", &probe]).output();
    if !made {
        return Some("`ip netns add` fails here".into());
    }
    None
}

fn skip_unless_shaping(test: &str) -> bool {
    if let Some(why) = cannot_shape() {
        println!("skipping {test}: {why} (shaped bench runs need root, ip and tc)");
        return true;
    }
    false
}

/// Namespaces named for the run with this pid, and any link in our own namespace that looks
/// like one of the bench's (it never creates any here).
fn leftovers(pid: u32) -> Vec<String> {
    let mut left = Vec::new();
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    for line in String::from_utf8_lossy(&ns.stdout).lines() {
        if line.starts_with(&format!("dcb-{pid}-")) {
            left.push(format!("namespace {line}"));
        }
    }
    let links = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .expect("ip link");
    for line in String::from_utf8_lossy(&links.stdout).lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        let ours = name == "vt"
            || (name.starts_with("vr") && name[2..].chars().all(|c| c.is_ascii_digit()));
        if ours && !name.is_empty() {
            left.push(format!("link {name}"));
        }
    }
    left
}

fn json_lines(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

/// Every method synced every step with its digest checked, and one summary per method.
fn check_results(lines: &[Value], steps: usize, link: &str) {
    let methods = ["full", "abs32+raw", "auto"];
    for m in methods {
        let mine: Vec<&Value> = lines
            .iter()
            .filter(|v| v["type"] == "step" && v["method"] == m)
            .collect();
        assert_eq!(mine.len(), steps, "{m}: {lines:?}");
        for v in mine {
            assert_eq!(v["digest_ok"], true, "{v}");
            assert_eq!(v["link"], link, "{v}");
            assert!(v["sync_ms"].as_f64().unwrap() > 0.0, "{v}");
            assert!(v["wire_bytes"].as_u64().unwrap() > 0, "{v}");
        }
        let summary: Vec<&Value> = lines
            .iter()
            .filter(|v| v["type"] == "summary" && v["method"] == m)
            .collect();
        assert_eq!(summary.len(), 1, "{m}");
        assert_eq!(summary[0]["digest_ok"], true);
    }
    // The full broadcast carries the whole model; the deltas carry less, auto least.
    let wire = |m: &str| {
        lines
            .iter()
            .find(|v| v["type"] == "summary" && v["method"] == m)
            .and_then(|v| v["wire_bytes"].as_f64())
            .unwrap()
    };
    assert!(wire("auto") < wire("abs32+raw") && wire("abs32+raw") < wire("full"));
}

#[test]
fn shaped_run_verifies_every_step_and_leaves_nothing_behind() {
    if skip_unless_shaping("the shaped bench run") {
        return;
    }
    let out_dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = bin();
    cmd.args([
        "bench", "--preset", "tiny", "--links", "wan", "--steps", "2", "--json", "--out",
    ])
    .arg(out_dir.path());
    let child = spawn(&mut cmd);
    let pid = child.id();
    let out = finish(child, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {stderr}");
    check_results(&json_lines(&out.stdout), 2, "wan");
    let png = std::fs::read(out_dir.path().join("bench.png")).expect("bench.png written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(out_dir.path().join("results.jsonl").exists());
    assert!(out_dir.path().join("summary.md").exists());
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn sigint_midway_tears_everything_down() {
    if skip_unless_shaping("the SIGINT bench run") {
        return;
    }
    let mut child = spawn(bin().args([
        "bench", "--preset", "tiny", "--links", "wan", "--steps", "100000", "--json",
    ]));
    let pid = child.id();
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let err_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = stderr.read_to_end(&mut b);
        b
    });
    // Wait until steps are running (a step line arrives), then interrupt.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            if line.contains("\"type\":\"step\"") {
                let _ = tx.send(());
            }
        }
    });
    let started = rx.recv_timeout(Duration::from_secs(30));
    let ns_during = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = String::from_utf8_lossy(&err_t.join().unwrap()).into_owned();
    assert!(started.is_ok(), "no step within 30 s: {err}");
    assert!(
        String::from_utf8_lossy(&ns_during.stdout).contains(&format!("dcb-{pid}-t")),
        "the run's namespaces should exist while it runs"
    );
    let status = status.expect("bench did not exit within 20 s of SIGINT");
    assert!(!status.success(), "an interrupted run must fail");
    assert!(err.contains("interrupted"), "{err}");
    let left = leftovers(pid);
    assert!(left.is_empty(), "left behind after SIGINT: {left:?}");
}

#[test]
fn loopback_run_needs_no_root() {
    let out = run_within(
        bin().args([
            "bench",
            "--preset",
            "tiny",
            "--loopback",
            "--steps",
            "2",
            "--json",
        ]),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench --loopback failed: {stderr}");
    check_results(&json_lines(&out.stdout), 2, "loopback");
}

#[test]
fn bad_links_are_refused_before_anything_starts() {
    let out = run_within(
        bin().args(["bench", "--preset", "tiny", "--links", "lan"]),
        Duration::from_secs(10),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown link `lan`"), "{err}");
}

#[test]
fn loopback_run_with_receivers_applying_flushes_as_they_arrive() {
    // Small flushes, so that every delta comes in several and is written flush by flush.
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = run_within(
        bin()
            .args([
                "bench",
                "--preset",
                "tiny",
                "--loopback",
                "--steps",
                "2",
                "--bucket-size",
                "2K",
                "--apply-as-received",
                "--json",
                "--out",
            ])
            .arg(out_dir.path()),
        Duration::from_secs(60),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench --apply-as-received failed: {stderr}"
    );
    let lines = json_lines(&out.stdout);
    check_results(&lines, 2, "loopback");
    let flushes_per_auto_step = lines
        .iter()
        .filter(|v| v["type"] == "step" && v["method"] == "auto")
        .map(|v| v["wire_bytes"].as_u64().unwrap().div_ceil(2 << 10))
        .min()
        .unwrap();
    assert!(flushes_per_auto_step > 1, "want multi-flush deltas");
    // The results file says first how the run was made.
    let saved = std::fs::read_to_string(out_dir.path().join("results.jsonl")).expect("results");
    let run = json_lines(saved.as_bytes()).remove(0);
    assert_eq!(run["type"], "run", "{run}");
    assert_eq!(run["apply_as_received"], true, "{run}");
    assert_eq!(run["bucket_size"], 2048, "{run}");
    assert_eq!(run["preset"], "tiny", "{run}");
}
