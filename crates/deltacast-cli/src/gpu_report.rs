//! `deltacast gpu-report`: the GPU sync benchmark's results (the JSON files that
//! `scripts/gpu-bench.sh` writes, one per model and link) as a table and a bar chart: per run,
//! the median sync time of the full broadcast, the plain PyTorch delta and deltacast, on a
//! logarithmic axis.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use plotters::prelude::*;
use serde_json::Value;

use crate::bench::plot::{canvas, nice, padded, COLORS};

/// One run of the GPU bench: a model on a link, three medians.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub label: String,
    pub full_ms: f64,
    pub plain_ms: f64,
    pub deltacast_ms: f64,
}

const METHODS: [&str; 3] = ["full NCCL broadcast", "plain PyTorch delta", "deltacast"];

/// Reads one `gpu_sync_<model>_<link>.json`.
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
    let entropy = match text_at("/args/entropy") {
        "?" | "auto" => String::new(),
        e => format!(" (entropy {e})"),
    };
    Ok(Run {
        label: format!("{} {}{entropy}", text_at("/model"), text_at("/transport")),
        full_ms: field("/summary/full/median_ms")?,
        plain_ms: field("/summary/plain/median_ms")?,
        deltacast_ms: field("/summary/deltacast/median_ms")?,
    })
}

/// The table, one line per run.
pub fn table(runs: &[Run]) -> String {
    let mut out = format!(
        "{:<28} {:>12} {:>12} {:>14} {:>9} {:>9}\n",
        "run", "full ms", "plain ms", "deltacast ms", "full/dc", "plain/dc"
    );
    for r in runs {
        out += &format!(
            "{:<28} {:>12.2} {:>12.2} {:>14.2} {:>8.1}x {:>8.1}x\n",
            r.label,
            r.full_ms,
            r.plain_ms,
            r.deltacast_ms,
            r.full_ms / r.deltacast_ms,
            r.plain_ms / r.deltacast_ms
        );
    }
    out
}

/// Grouped bars: one group per run, one bar per method, time on a log axis.
pub fn draw(path: &Path, title: &str, runs: &[Run]) -> Result<()> {
    if runs.is_empty() {
        bail!("no runs to draw");
    }
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let root = canvas(path, title)?;
    let (plot_area, legend_area) = root.split_horizontally(900);
    let times: Vec<f64> = runs
        .iter()
        .flat_map(|r| [r.full_ms, r.plain_ms, r.deltacast_ms])
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
    for (g, r) in runs.iter().enumerate() {
        for (k, ms) in [r.full_ms, r.plain_ms, r.deltacast_ms]
            .into_iter()
            .enumerate()
        {
            let x0 = g as f64 + 0.12 + 0.26 * k as f64;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, floor), (x0 + 0.24, ms)],
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
    for (k, name) in METHODS.iter().enumerate() {
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
    print!("{}", table(&runs));
    if let Some(out) = out {
        draw(out, title, &runs)?;
        println!("wrote {}", out.display());
    }
    Ok(())
}
