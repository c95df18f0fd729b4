//! The PNG of `deltacast bench --out DIR`: median sync time per step against link rate, one
//! line per method, both axes logarithmic, plus deltacast's floor (diff + wire ÷ rate) dashed.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// One method's median on one link.
pub struct Point {
    pub method: String,
    pub rate_gbit: f64,
    pub sync_s: f64,
    pub floor_s: Option<f64>,
}

pub(crate) const COLORS: [RGBColor; 6] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn label(method: &str) -> String {
    match method {
        "full" => "full BF16 broadcast".into(),
        "auto" => "deltacast (auto codec)".into(),
        "abs32+raw" => "abs32+raw deltas".into(),
        other => format!("deltacast ({other})"),
    }
}

/// `lo..hi` padded by a factor on a log axis (at least a factor of 10 wide).
pub(crate) fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (lo.max(1e-9) / 1.6, hi.max(1e-9) * 1.6);
    if hi / lo < 10.0 {
        let mid = (lo * hi).sqrt();
        (lo, hi) = (mid / 10f64.sqrt(), mid * 10f64.sqrt());
    }
    lo..hi
}

/// Labels only at 1, 2 and 5 times a power of ten (a log axis offers every integer multiple).
pub(crate) fn nice(v: &f64) -> String {
    if *v <= 0.0 {
        return String::new();
    }
    let exp = v.log10().floor();
    let mantissa = v / 10f64.powf(exp);
    let near = |m: f64| (mantissa - m).abs() < 0.05 * m;
    if !(near(1.0) || near(2.0) || near(5.0)) {
        return String::new();
    }
    let decimals = (-exp).max(0.0) as usize;
    format!("{v:.decimals$}")
}

/// A white 1200×640 PNG canvas at `path` with `title` on top, the embedded font registered
/// (no system fonts needed): what every chart of the CLI draws on.
pub(crate) fn canvas<'a>(
    path: &'a Path,
    title: &str,
) -> Result<DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>> {
    register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::UBUNTU_LIGHT,
    )
    .map_err(|_| anyhow!("cannot load the embedded font"))?;
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let root = BitMapBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    root.titled(title, ("sans-serif", 22)).map_err(err)
}

pub fn draw(path: &Path, title: &str, methods: &[String], points: &[Point]) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<_>| anyhow!("drawing {}: {e:?}", path.display());
    let root = canvas(path, title)?;
    // The chart on the left, the legend in a column of its own on the right.
    let (plot_area, legend_area) = root.split_horizontally(840);
    let rates: Vec<f64> = points.iter().map(|p| p.rate_gbit).collect();
    let times: Vec<f64> = points
        .iter()
        .flat_map(|p| std::iter::once(p.sync_s).chain(p.floor_s))
        .collect();
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let x = padded(min(&rates), max(&rates));
    let y = padded(min(&times), max(&times));
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x.log_scale(), y.log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_label_formatter(&nice)
        .y_label_formatter(&nice)
        .x_desc("link rate (Gbit/s)")
        .y_desc("sync time per step (s)")
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .draw()
        .map_err(err)?;
    // (legend, color, points, dashed)
    type Series = (String, RGBColor, Vec<(f64, f64)>, bool);
    let mut series: Vec<Series> = Vec::new();
    for (k, m) in methods.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let mut pts: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| &p.method == m)
            .map(|p| (p.rate_gbit, p.sync_s))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        series.push((label(m), color, pts, false));
    }
    for (k, m) in methods.iter().enumerate() {
        if m != "auto" && m != "full" {
            continue;
        }
        let mut floor: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| &p.method == m)
            .filter_map(|p| Some((p.rate_gbit, p.floor_s?)))
            .collect();
        floor.sort_by(|a, b| a.0.total_cmp(&b.0));
        let name = if m == "full" {
            "floor of the full broadcast: bytes ÷ rate".to_string()
        } else {
            "floor of deltacast: diff + bytes ÷ rate".to_string()
        };
        if !floor.is_empty() {
            series.push((name, COLORS[k % COLORS.len()], floor, true));
        }
    }
    let mut legend_y = 40;
    for (name, color, pts, dashed) in series {
        if pts.is_empty() {
            continue;
        }
        let style = ShapeStyle::from(&color).stroke_width(if dashed { 1 } else { 3 });
        legend_area
            .draw(&PathElement::new(
                vec![(0, legend_y), (28, legend_y)],
                style,
            ))
            .map_err(err)?;
        legend_area
            .draw(&Text::new(
                name.clone(),
                (36, legend_y - 9),
                ("sans-serif", 16).into_font(),
            ))
            .map_err(err)?;
        legend_y += 28;
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))
                .map_err(err)?;
        } else {
            chart
                .draw_series(LineSeries::new(pts.clone(), style))
                .map_err(err)?;
        }
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}
