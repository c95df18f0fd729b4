//! `deltacast gpu-report`: the GPU sync benchmarks' results as a table and a bar chart, per
//! run the median sync time of each method on a logarithmic axis. Reads the JSON files of
//! `scripts/gpu-bench.sh` (bench/gpu_sync.py: full broadcast, plain PyTorch delta, deltacast)
//! and of bench/gpu_sharded.py (sharded trainers: gather + broadcast, deltacast); one chart
//! takes the runs of one bench.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;

use crate::bench::plot::{canvas, nice, padded, COLORS};

/// One run of a GPU bench: a model on a link, the median time of each method (deltacast
/// last).
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub label: String,
    /// (method, median ms).
    pub methods: Vec<(Method, f64)>,
}

impl Run {
    fn deltacast_ms(&self) -> f64 {
        self.methods.last().map_or(f64::NAN, |m| m.1)
    }
}

/// A method of a bench: its name in the legend, in the table, and the JSON pointer of its
/// median.
type Method = (&'static str, &'static str, &'static str);

/// The methods of bench/gpu_sync.py's results.
const SYNC_METHODS: [Method; 3] = [
    ("full NCCL broadcast", "full", "/summary/full/median_ms"),
    ("plain PyTorch delta", "plain", "/summary/plain/median_ms"),
    ("deltacast", "deltacast", "/summary/deltacast/median_ms"),
];

/// The methods of bench/gpu_sync.py's results with `--transport ipc`: no NCCL anywhere.
const IPC_METHODS: [Method; 3] = [
    (
        "full copy through a CUDA-IPC bucket",
        "full",
        "/summary/full/median_ms",
    ),
    (
        "plain PyTorch delta (CUDA-IPC bucket)",
        "plain",
        "/summary/plain/median_ms",
    ),
    (
        "deltacast (CUDA-IPC link)",
        "deltacast",
        "/summary/deltacast/median_ms",
    ),
];

/// The methods of bench/gpu_sharded.py's results.
const SHARDED_METHODS: [Method; 2] = [
    ("gather + broadcast", "whole", "/median_whole_ms"),
    ("deltacast (sharded)", "deltacast", "/median_deltacast_ms"),
];

/// Reads one result file of either bench.
pub fn read_run(path: &Path) -> Result<Run> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let v: Value = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    let field = |p: &str| -> Result<f64> {
        v.pointer(p)
            .and_then(Value::as_f64)
            .ok_or_else(|| anyhow!("{}: no number at {p}", path.display()))
    };
    let text_at = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or("?");
    if v.pointer("/ok") != Some(&Value::Bool(true)) {
        bail!("{}: the run did not pass its checks", path.display());
    }
    let sharded = v.pointer("/median_whole_ms").is_some();
    let entropy_at = if sharded { "/entropy" } else { "/args/entropy" };
    let entropy = match text_at(entropy_at) {
        "?" | "auto" => String::new(),
        e => format!(" (entropy {e})"),
    };
    // An IPC run says where its two processes ran.
    let gpus = match v.pointer("/args/devices").and_then(Value::as_array) {
        Some(d) if text_at("/transport") == "ipc" && d.len() == 2 && d[0] == d[1] => " 1 GPU",
        Some(_) if text_at("/transport") == "ipc" => " 2 GPUs",
        _ => "",
    };
    let table: &[Method] = if sharded {
        &SHARDED_METHODS
    } else if text_at("/transport") == "ipc" {
        &IPC_METHODS
    } else {
        &SYNC_METHODS
    };
    Ok(Run {
        label: format!(
            "{} {}{gpus}{entropy}",
            text_at("/model"),
            text_at("/transport")
        ),
        methods: table
            .iter()
            .map(|&m| field(m.2).map(|ms| (m, ms)))
            .collect::<Result<_>>()?,
    })
}

/// The methods of `runs`, which must all come from one bench.
fn method_names(runs: &[Run]) -> Result<Vec<Method>> {
    let names: Vec<Method> = runs
        .first()
        .map(|r| r.methods.iter().map(|m| m.0).collect())
        .unwrap_or_default();
    if runs
        .iter()
        .any(|r| !r.methods.iter().map(|m| m.0).eq(names.iter().copied()))
    {
        bail!(
            "the files mix the results of different benches (or of NCCL and CUDA-IPC runs): \
             one report per bench"
        );
    }
    Ok(names)
}

/// The table, one line per run: each method's median and its ratio to deltacast's.
pub fn table(runs: &[Run]) -> Result<String> {
    let methods = method_names(runs)?;
    let others = &methods[..methods.len().saturating_sub(1)];
    let mut out = format!("{:<28}", "run");
    for m in &methods {
        out += &format!(" {:>14}", format!("{} ms", m.1));
    }
    for m in others {
        out += &format!(" {:>14}", format!("{}/deltacast", m.1));
    }
    out += "\n";
    for r in runs {
        out += &format!("{:<28}", r.label);
        for (_, ms) in &r.methods {
            out += &format!(" {ms:>14.2}");
        }
        for (_, ms) in &r.methods[..others.len()] {
            out += &format!(" {:>13.1}x", ms / r.deltacast_ms());
        }
        out += "\n";
    }
    Ok(out)
}

/// Grouped bars: one group per run, one bar per method, time on a log axis.
pub fn draw(path: &Path, title: &str, runs: &[Run]) -> Result<()> {
    if runs.is_empty() {
        bail!("no runs to draw");
    }
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let root = canvas(path, title)?;
    let (plot_area, legend_area) = root.split_horizontally(900);
    let names = method_names(runs)?;
    let times: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.methods.iter().map(|m| m.1))
        .collect();
    let lo = times.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = times.iter().copied().fold(0.0, f64::max);
    let y = padded(lo, hi);
    let floor = y.start;
    let n = runs.len() as f64;
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, y.log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&nice)
        .y_desc("sync time per step (ms)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    // Bars share the group's width 0.78, whatever the number of methods.
    let step = 0.78 / names.len() as f64;
    for (g, r) in runs.iter().enumerate() {
        for (k, &(_, ms)) in r.methods.iter().enumerate() {
            let x0 = g as f64 + 0.12 + step * k as f64;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, floor), (x0 + step * 0.92, ms)],
                    COLORS[k].filled(),
                )))
                .map_err(err)?;
        }
        // The run's name under its group.
        let (px, py) = chart.backend_coord(&(g as f64 + 0.5, floor));
        plot_area
            .draw(&Text::new(
                r.label.clone(),
                (px - 4 * r.label.len() as i32, py + 12),
                ("sans-serif", 15).into_font(),
            ))
            .map_err(err)?;
    }
    for (k, &(name, _, _)) in names.iter().enumerate() {
        let y = 40 + 30 * k as i32;
        legend_area
            .draw(&Rectangle::new(
                [(0, y - 8), (24, y + 8)],
                COLORS[k].filled(),
            ))
            .map_err(err)?;
        legend_area
            .draw(&Text::new(
                name.to_string(),
                (32, y - 9),
                ("sans-serif", 16).into_font(),
            ))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The subcommand: reads every file, prints the table, draws the chart when asked.
pub fn run(files: &[PathBuf], out: Option<&Path>, title: &str) -> Result<()> {
    let runs = files
        .iter()
        .map(|f| read_run(f))
        .collect::<Result<Vec<_>>>()?;
    print!("{}", table(&runs)?);
    if let Some(out) = out {
        draw(out, title, &runs)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
