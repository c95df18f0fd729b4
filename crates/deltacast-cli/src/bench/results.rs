//! A bench run's results: per-step samples, medians per link and method, and the report
//! (table, JSON lines, results.jsonl, summary.md and the plot).

use anyhow::Result;
use serde_json::{json, Value};

use super::netns::LinkSpec;
use super::{plot, BenchArgs};
use crate::output::{bytes, count, json_line};

/// One method's sync of one step on one link.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    pub(super) link: String,
    pub(super) rate_bps: Option<u64>,
    pub(super) delay_us: Option<u64>,
    pub(super) delay_emulated: bool,
    pub(super) step: u64,
    pub(super) method: String,
    pub(super) sync_ms: f64,
    pub(super) wire_bytes: u64,
    pub(super) diff_ms: f64,
    pub(super) changed_fraction: f64,
    pub(super) digest_ok: bool,
    /// Deltas: when the leader had its last flush ready / written, the receivers' decode time.
    pub(super) timing: Value,
    /// Deltas: chunks per codec the encoder chose.
    pub(super) codecs: Value,
}

impl Sample {
    /// diff time (deltas only) + wire bytes ÷ link rate.
    fn floor_ms(&self) -> Option<f64> {
        let rate = self.rate_bps? as f64;
        let wire = self.wire_bytes as f64 * 8.0 / rate * 1e3;
        Some(if self.method == "full" {
            wire
        } else {
            self.diff_ms + wire
        })
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "type": "step", "link": self.link, "rate_bps": self.rate_bps,
            "delay_ms": self.delay_us.map(|d| d as f64 / 1e3),
            "delay_emulated": self.delay_emulated, "step": self.step,
            "method": self.method, "sync_ms": self.sync_ms, "wire_bytes": self.wire_bytes,
            "diff_ms": self.diff_ms, "floor_ms": self.floor_ms(),
            "changed_fraction": self.changed_fraction, "digest_ok": self.digest_ok,
            "timing": self.timing, "codecs": self.codecs,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians over the steps of one link and method; ratios are medians of per-step ratios
/// (paired within a step, so slow drift cancels).
#[derive(Debug, Clone)]
struct Summary {
    link: String,
    rate_bps: Option<u64>,
    delay_us: Option<u64>,
    delay_emulated: bool,
    method: String,
    steps: usize,
    sync_ms: f64,
    sync_ms_min: f64,
    sync_ms_max: f64,
    wire_bytes: f64,
    diff_ms: f64,
    floor_ms: Option<f64>,
    over_floor: Option<f64>,
    vs_full: Option<f64>,
    vs_abs32: Option<f64>,
    all_ok: bool,
}

impl Summary {
    fn json(&self) -> Value {
        json!({
            "type": "summary", "link": self.link, "rate_bps": self.rate_bps,
            "delay_ms": self.delay_us.map(|d| d as f64 / 1e3),
            "delay_emulated": self.delay_emulated, "method": self.method,
            "steps": self.steps, "sync_ms": self.sync_ms, "sync_ms_min": self.sync_ms_min,
            "sync_ms_max": self.sync_ms_max, "wire_bytes": self.wire_bytes,
            "diff_ms": self.diff_ms, "floor_ms": self.floor_ms, "sync_over_floor": self.over_floor,
            "speedup_vs_full": self.vs_full, "speedup_vs_abs32_raw": self.vs_abs32,
            "effective_gbit_s": self.wire_bytes * 8.0 / (self.sync_ms * 1e6),
            "digest_ok": self.all_ok,
        })
    }
}

fn summarize(samples: &[Sample], links: &[String], methods: &[String]) -> Vec<Summary> {
    let mut out = Vec::new();
    for link in links {
        let of = |m: &str| -> Vec<&Sample> {
            samples
                .iter()
                .filter(|s| &s.link == link && s.method == m)
                .collect()
        };
        for m in methods {
            let mine = of(m);
            if mine.is_empty() {
                continue;
            }
            let paired = |other: &str| -> Option<f64> {
                if other == m {
                    return None;
                }
                let theirs = of(other);
                let r: Vec<f64> = mine
                    .iter()
                    .filter_map(|s| {
                        let t = theirs.iter().find(|t| t.step == s.step)?;
                        Some(t.sync_ms / s.sync_ms)
                    })
                    .collect();
                (!r.is_empty()).then(|| median(r))
            };
            let floors: Vec<f64> = mine.iter().filter_map(|s| s.floor_ms()).collect();
            let over: Vec<f64> = mine
                .iter()
                .filter_map(|s| Some(s.sync_ms / s.floor_ms()?))
                .collect();
            let times: Vec<f64> = mine.iter().map(|s| s.sync_ms).collect();
            out.push(Summary {
                link: link.clone(),
                rate_bps: mine[0].rate_bps,
                delay_us: mine[0].delay_us,
                delay_emulated: mine[0].delay_emulated,
                method: m.clone(),
                steps: mine.len(),
                sync_ms: median(times.clone()),
                sync_ms_min: times.iter().copied().fold(f64::INFINITY, f64::min),
                sync_ms_max: times.iter().copied().fold(0.0, f64::max),
                wire_bytes: median(mine.iter().map(|s| s.wire_bytes as f64).collect()),
                diff_ms: median(mine.iter().map(|s| s.diff_ms).collect()),
                floor_ms: (!floors.is_empty()).then(|| median(floors)),
                over_floor: (!over.is_empty()).then(|| median(over)),
                vs_full: paired("full"),
                vs_abs32: paired("abs32+raw"),
                all_ok: mine.iter().all(|s| s.digest_ok),
            });
        }
    }
    out
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// The summary as a Markdown table (printed, and written to summary.md).
fn markdown(summaries: &[Summary]) -> String {
    let mut s = String::from(
        "| link | method | sync ms (median) | min–max | wire | diff ms | floor ms | sync / floor | vs full | vs abs32+raw | Gbit/s on the wire | digests |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for m in summaries {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1}–{:.1} | {} | {} | {} | {} | {} | {} | {:.2} | {} |\n",
            m.link,
            m.method,
            m.sync_ms,
            m.sync_ms_min,
            m.sync_ms_max,
            bytes(m.wire_bytes as u64),
            if m.method == "full" {
                "-".into()
            } else {
                format!("{:.1}", m.diff_ms)
            },
            opt(m.floor_ms, |f| format!("{f:.1}")),
            opt(m.over_floor, |r| format!("{r:.2}×")),
            opt(m.vs_full, |r| format!("{r:.1}×")),
            opt(m.vs_abs32, |r| format!("{r:.1}×")),
            m.wire_bytes * 8.0 / (m.sync_ms * 1e6),
            if m.all_ok { "all ok" } else { "MISMATCH" },
        ));
    }
    s
}

pub(super) fn report(
    args: &BenchArgs,
    methods: &[String],
    links: &[LinkSpec],
    samples: &[Sample],
    seeded: &Value,
) -> Result<()> {
    let names: Vec<String> = links.iter().map(|l| l.name.clone()).collect();
    let summaries = summarize(samples, &names, methods);
    let table = markdown(&summaries);
    if args.json {
        for s in &summaries {
            json_line(&s.json());
        }
    } else {
        let seeds: Vec<String> = seeded["methods"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                format!(
                    "{} {:.0} ms",
                    m["method"].as_str().unwrap_or("?"),
                    m["sync_ms"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        println!("seeds (unshaped, not measured): {}", seeds.join(", "));
        println!(
            "{:>8} {:>4} {:>10} {:>10} {:>10}",
            "link", "step", "method", "sync ms", "wire"
        );
        for s in samples {
            let t = &s.timing;
            let timing = match t["last_flush_ready_ms"].as_f64() {
                Some(ready) => format!(
                    "; last flush ready {ready:.0} ms, written {:.0} ms; receiver decode+apply \
                     {:.0} ms (last flush {:.0} ms)",
                    t["last_flush_written_ms"].as_f64().unwrap_or(0.0),
                    t["receiver_receive_ms"].as_f64().unwrap_or(0.0),
                    t["receiver_last_flush_ms"].as_f64().unwrap_or(0.0),
                ),
                None => String::new(),
            };
            println!(
                "{:>8} {:>4} {:>10} {:>10.1} {:>10}  diff {:.1} ms, floor {}{timing}{}",
                s.link,
                s.step,
                s.method,
                s.sync_ms,
                bytes(s.wire_bytes),
                s.diff_ms,
                opt(s.floor_ms(), |f| format!("{f:.1} ms")),
                if s.digest_ok { "" } else { ", DIGEST MISMATCH" }
            );
        }
        println!();
        print!("{table}");
        println!(
            "floor = diff time alone (slowest rank; deltas only) + wire bytes ÷ link rate; \
             ratios are medians of per-step ratios"
        );
    }
    if let Some(dir) = &args.out {
        // First, how the run was made, so that the file can be read on its own later.
        let mut lines = format!(
            "{}\n",
            json!({
                "type": "run", "preset": args.preset, "layers": args.layers,
                "steps": args.steps, "trainers": args.trainers, "receivers": args.receivers,
                "methods": args.methods, "lr": args.lr, "seed": args.seed,
                "bucket_size": args.bucket_size.bytes(), "full_bucket_size": args.full_bucket_size.bytes(),
                "chunk_elems": args.chunk_elems, "apply_as_received": args.apply_as_received,
                "loopback": args.loopback,
            })
        );
        for s in samples {
            lines.push_str(&format!("{}\n", s.json()));
        }
        for s in &summaries {
            lines.push_str(&format!("{}\n", s.json()));
        }
        std::fs::write(dir.join("results.jsonl"), lines)?;
        let made = format!(
            "\nRun: preset {}{}, {}, {}, {}, methods {}, flushes of up to {}, chunks of {}, \
             receivers {}{}.\n",
            args.preset,
            args.layers
                .map(|l| format!(" ({})", count(l, "layer", "layers")))
                .unwrap_or_default(),
            count(args.steps, "step", "steps"),
            count(args.trainers as u64, "trainer rank", "trainer ranks"),
            count(args.receivers as u64, "receiver", "receivers"),
            args.methods,
            args.bucket_size,
            count(args.chunk_elems, "element", "elements"),
            if args.apply_as_received {
                "applying flushes as they arrive"
            } else {
                "staging each sync"
            },
            if args.loopback { ", loopback" } else { "" },
        );
        std::fs::write(dir.join("summary.md"), format!("{table}{made}"))?;
        let png = dir.join("bench.png");
        let shape = format!(
            "{}{}",
            args.preset,
            args.layers
                .map(|l| format!(" ({})", count(l, "layer", "layers")))
                .unwrap_or_default()
        );
        let points: Vec<plot::Point> = summaries
            .iter()
            .filter_map(|s| {
                Some(plot::Point {
                    method: s.method.clone(),
                    rate_gbit: s.rate_bps? as f64 / 1e9,
                    sync_s: s.sync_ms / 1e3,
                    floor_s: s.floor_ms.map(|f| f / 1e3),
                })
            })
            .collect();
        if points.is_empty() {
            eprintln!("no plot: a loopback run has no link rate to plot against");
        } else {
            let title = format!(
                "{shape}: sync time per step, {} to {}{}",
                count(args.trainers as u64, "trainer rank", "trainer ranks"),
                count(args.receivers as u64, "receiver", "receivers"),
                if samples.iter().any(|s| !s.delay_emulated) {
                    ", rate-shaped links"
                } else {
                    ""
                }
            );
            plot::draw(&png, &title, methods, &points)?;
            if !args.json {
                println!("wrote {}", png.display());
            }
        }
        if !args.json {
            println!(
                "wrote {} and {}",
                dir.join("results.jsonl").display(),
                dir.join("summary.md").display()
            );
        }
    }
    Ok(())
}
