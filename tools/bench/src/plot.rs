//! What `bench-compare` measured, drawn as an SVG a reader takes in at a glance: per size, the
//! distribution of quota reserved → `Ready` of each controller (the share of Workloads answered
//! by each second), and where the median Workload's time went (the stages stacked, in the order
//! they happened to it).

use std::path::Path;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

use crate::{Mark, Marks, Stage, quantile};

/// One controller's run of one size.
#[derive(Debug)]
pub struct Drawn<'a> {
    /// `Kueue built-in`, `ours`.
    pub label: &'a str,
    pub marks: &'a [Marks],
}

/// The milestones after the reservation that the stacked bars show, with their colours.
const MILESTONES: [(Mark, &str, RGBColor); 4] = [
    (
        Mark::Askable,
        "Kueue adds the entry",
        RGBColor(148, 103, 189),
    ),
    (Mark::Request, "request created", RGBColor(31, 119, 180)),
    (Mark::Provisioned, "provisioned", RGBColor(44, 160, 44)),
    (Mark::Ready, "check Ready", RGBColor(214, 39, 40)),
];

/// The distribution's colours: Kueue's built-in check, ours.
const LINES: [RGBColor; 2] = [RGBColor(127, 127, 127), RGBColor(255, 127, 14)];

/// Draws the runs of one size into `path` (SVG) under `title`.
pub fn draw(path: &Path, title: &str, runs: &[Drawn<'_>]) -> Result<()> {
    let root = SVGBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(520);
    distribution(&left, runs)?;
    stages(&right, runs)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Seconds from the reservation to `mark` for each Workload that has both, sorted.
fn since_reserved(marks: &[Marks], mark: Mark) -> Vec<f64> {
    Stage::new("", Mark::Reserved, mark)
        .durations(marks)
        .iter()
        .map(std::time::Duration::as_secs_f64)
        .collect()
}

/// The `q` quantile of sorted seconds.
fn seconds_quantile(sorted: &[f64], q: f64) -> f64 {
    let as_durations: Vec<std::time::Duration> = sorted
        .iter()
        .map(|s| std::time::Duration::from_secs_f64(*s))
        .collect();
    quantile(&as_durations, q).as_secs_f64()
}

/// The share of Workloads answered (`Ready`) by each second after their reservation.
fn distribution<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    runs: &[Drawn<'_>],
) -> Result<()> {
    let series: Vec<(&str, Vec<f64>)> = runs
        .iter()
        .map(|r| (r.label, since_reserved(r.marks, Mark::Ready)))
        .collect();
    let longest = series
        .iter()
        .filter_map(|(_, d)| d.last().copied())
        .fold(1.0_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("quota reserved → check Ready", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..longest * 1.05, 0.0..100.0)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("seconds after the reservation")
        .y_desc("% of Workloads answered")
        .draw()
        .map_err(plot_error)?;
    for (label, d) in &series {
        let n = d.len().max(1) as f64;
        // The same colour for a controller in every plot.
        let colour = LINES[usize::from(label.starts_with("ours"))];
        let points = d
            .iter()
            .enumerate()
            .map(|(k, s)| (*s, 100.0 * (k + 1) as f64 / n));
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(plot_error)?
            .label(format!("{label} (p99 {:.1} s)", seconds_quantile(d, 0.99)))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

/// Per controller, the median Workload's milestones after its reservation, in the order they
/// came (a request made before the entry shows before it), as one stacked bar.
fn stages<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    runs: &[Drawn<'_>],
) -> Result<()> {
    let bars: Vec<(&str, Vec<(f64, usize)>)> = runs
        .iter()
        .map(|r| {
            let mut at: Vec<(f64, usize)> = MILESTONES
                .iter()
                .enumerate()
                .map(|(i, (mark, ..))| (seconds_quantile(&since_reserved(r.marks, *mark), 0.5), i))
                .collect();
            at.sort_by(|a, b| a.0.total_cmp(&b.0));
            (r.label, at)
        })
        .collect();
    let longest = bars
        .iter()
        .flat_map(|(_, at)| at.iter().map(|(s, _)| *s))
        .fold(1.0_f64, f64::max);
    // A band above the bars keeps the legend off them.
    let rows = bars.len().max(1) as f64;
    let top = rows + 0.9;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "median Workload: time after the reservation",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(10)
        .build_cartesian_2d(0.0..longest * 1.05, 0.0..top)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .disable_y_axis()
        .x_desc("seconds")
        .draw()
        .map_err(plot_error)?;
    for (row, (label, at)) in bars.iter().enumerate() {
        let (y0, y1) = (row as f64 + 0.15, row as f64 + 0.7);
        // The controller's name above its bar.
        chart
            .draw_series([Text::new(
                (*label).to_string(),
                (longest * 0.01, row as f64 + 0.85),
                ("sans-serif", 14).into_font(),
            )])
            .map_err(plot_error)?;
        let mut from = 0.0;
        for (to, milestone) in at {
            let colour = MILESTONES[*milestone].2;
            chart
                .draw_series([Rectangle::new([(from, y0), (*to, y1)], colour.filled())])
                .map_err(plot_error)?;
            from = *to;
        }
    }
    // The legend: one entry per milestone, the colour of the segment that ends there.
    for (_, name, colour) in MILESTONES {
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())
            .map_err(plot_error)?
            .label(format!("… until {name}"))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], colour.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

fn plot_error<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the benchmark's plot: {e}")
}
