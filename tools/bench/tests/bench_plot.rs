//! The benchmark's plot, drawn from made-up marks (no cluster): it is an SVG with both
//! controllers' curves and bars, named, and the stages' legend.

use std::time::Duration;

use anyhow::{Result, ensure};
use bench::plot::{Drawn, draw};
use bench::{Mark, Marks};
use tokio::time::Instant;

/// `n` Workloads reserved at `t0`; mark `i` of each after the seconds `after(i)` gives.
fn marks(n: u32, after: impl Fn(u32) -> [f64; 4]) -> Vec<Marks> {
    let t0 = Instant::now();
    (0..n)
        .map(|i| {
            let mut m = Marks::default();
            m.first(Mark::Reserved, t0);
            let at = after(i);
            for (mark, secs) in [Mark::Askable, Mark::Request, Mark::Provisioned, Mark::Ready]
                .into_iter()
                .zip(at)
            {
                m.first(mark, t0 + Duration::from_secs_f64(secs));
            }
            m
        })
        .collect()
}

#[test]
fn a_size_is_drawn_with_both_controllers_and_the_stages() -> Result<()> {
    let f = |i: u32| f64::from(i) / 10.0;
    // The built-in asks after the entry; ours before it.
    let built_in = marks(100, |i| [5.0 + f(i), 8.0 + f(i), 8.5 + f(i), 12.0 + f(i)]);
    let ours = marks(100, |i| [5.0 + f(i), 1.0 + f(i), 1.5 + f(i), 6.0 + f(i)]);
    let dir = std::env::temp_dir().join(format!("bench-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("100x1.svg");
    let runs = [
        Drawn {
            label: "Kueue built-in",
            marks: &built_in,
        },
        Drawn {
            label: "ours",
            marks: &ours,
        },
    ];
    draw(&path, "100 Workloads × 1 podset(s)", &runs)?;
    let svg = std::fs::read_to_string(&path)?;
    ensure!(
        svg.starts_with("<svg"),
        "not an SVG: {}",
        &svg[..svg.len().min(80)]
    );
    for text in [
        "100 Workloads × 1 podset(s)",
        "Kueue built-in (p99 21.8 s)",
        "ours (p99 15.8 s)",
        "until Kueue adds the entry",
        "until request created",
        "until check Ready",
    ] {
        ensure!(svg.contains(text), "{text:?} missing from the plot");
    }
    // Both bars carry their controller's name.
    // (plotters writes a text element's content on a line of its own)
    ensure!(
        svg.matches("\nours\n</text>").count() == 1,
        "the bar of ours is unnamed"
    );
    ensure!(
        svg.matches("\nKueue built-in\n</text>").count() == 1,
        "the built-in's bar is unnamed"
    );
    let _ = std::fs::copy(&path, std::env::temp_dir().join("bench-plot-last.svg"));
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
