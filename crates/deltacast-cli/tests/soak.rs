//! A short `deltacast soak`: every sync gets a fault, and the report must show each one
//! recovered with receivers bit-identical to the trainer (the soak checks bytes and digests
//! itself; this test checks that it says so, and that a failure would be visible).

use std::process::Command;

fn soak(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltacast"))
        .arg("soak")
        .args(args)
        .output()
        .expect("run deltacast soak");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), text)
}

#[test]
fn quick_soak_recovers_every_fault_bit_exactly() {
    let (ok, out) = soak(&[
        "--syncs",
        "12",
        "--receivers",
        "2",
        "--fault-rate",
        "1",
        "--seed",
        "7",
        "--io-timeout-ms",
        "300",
        "--ack-timeout-ms",
        "800",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert!(ok, "{v:#}");
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["syncs_completed"], 12, "{v:#}");
    assert_eq!(v["final_version"], 12, "{v:#}");
    let injected = v["faults_injected"].as_u64().expect("faults_injected");
    assert!(
        injected >= 8,
        "a fault per sync after the seed, most take effect: {v:#}"
    );
    assert_eq!(v["faults_recovered"], injected, "{v:#}");
    assert_eq!(v["digest_mismatches"], 0, "{v:#}");
    assert_eq!(v["receivers_between_versions"], 0, "{v:#}");
    assert!(v["max_rss_bytes"].as_u64().is_some_and(|b| b > 0), "{v:#}");
    let kinds = v["injected_by_kind"].as_object().expect("by kind");
    assert_eq!(kinds.len(), 8, "{v:#}");
}

#[test]
fn soak_text_report_and_bad_options() {
    let (ok, out) = soak(&["--syncs", "3", "--receivers", "1", "--fault-rate", "0"]);
    assert!(ok, "{out}");
    assert!(out.contains("syncs completed            3 of 3"), "{out}");
    assert!(out.contains("result                     OK"), "{out}");
    let (ok, _) = soak(&["--receivers", "0"]);
    assert!(!ok);
}
