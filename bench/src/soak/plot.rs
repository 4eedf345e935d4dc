//! The run as a picture (SVG): table sizes, dead tuples, throughput and
//! acknowledgement latency over time, one panel each, sharing the time axis
//! (throughput and latency while sending; sizes and dead tuples through the
//! drain too).

use std::path::Path;

use plotters::prelude::*;

use super::sampler::is_tickmark;
use super::samples::{table_names, Phase, Sample};

/// One line of a panel.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
    /// A table keeps its colour in every panel.
    color: usize,
}

/// Draw `samples` into `path` (overwriting it).
pub fn write_svg(path: &Path, title: &str, samples: &[Sample]) -> Result<(), String> {
    let root = SVGBackend::new(path, (1100, 1400)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 22))
        .map_err(|e| e.to_string())?;
    let panels = root.split_evenly((4, 1));
    let minutes = |s: &Sample| s.t_s / 60.0;
    let names = table_names(samples);

    let mut sizes: Vec<Series> = names
        .iter()
        .enumerate()
        .map(|(color, name)| Series {
            name: name.clone(),
            points: samples
                .iter()
                .filter_map(|s| {
                    s.table(name)
                        .map(|t| (minutes(s), t.total_bytes as f64 / 1_048_576.0))
                })
                .collect(),
            dashed: !is_tickmark(name),
            color,
        })
        .collect();
    sizes.push(Series {
        name: "tickmark tables, total".to_owned(),
        points: samples
            .iter()
            .map(|s| (minutes(s), s.tickmark_bytes() as f64 / 1_048_576.0))
            .collect(),
        dashed: false,
        color: names.len(),
    });
    panel(
        &panels[0],
        "size with indexes (pg_total_relation_size), MB",
        &sizes,
    )?;

    let dead: Vec<Series> = names
        .iter()
        .enumerate()
        .filter(|(_, name)| is_tickmark(name))
        .map(|(color, name)| Series {
            name: name.clone(),
            points: samples
                .iter()
                .filter_map(|s| s.table(name).map(|t| (minutes(s), t.dead_tuples as f64)))
                .collect(),
            dashed: false,
            color,
        })
        .collect();
    panel(&panels[1], "dead tuples (n_dead_tup)", &dead)?;

    // Throughput and latency while sending (the drain's tail would drop to 0).
    let sending: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.phase == Phase::Sending)
        .collect();
    let throughput = vec![
        Series {
            name: "acknowledged/s".to_owned(),
            points: sending
                .iter()
                .copied()
                .map(|s| (minutes(s), s.acks_per_s()))
                .collect(),
            dashed: false,
            color: names.len() + 1,
        },
        Series {
            name: "events finished/s".to_owned(),
            points: sending
                .iter()
                .copied()
                .map(|s| (minutes(s), s.finished_per_s()))
                .collect(),
            dashed: false,
            color: names.len() + 2,
        },
    ];
    panel(&panels[2], "throughput, per second", &throughput)?;

    let latency = vec![
        Series {
            name: "ack p50".to_owned(),
            points: sending
                .iter()
                .copied()
                .filter(|s| !s.latencies_ms.is_empty())
                .map(|s| (minutes(s), s.ack_ms(0.50)))
                .collect(),
            dashed: false,
            color: names.len() + 1,
        },
        Series {
            name: "ack p99".to_owned(),
            points: sending
                .iter()
                .copied()
                .filter(|s| !s.latencies_ms.is_empty())
                .map(|s| (minutes(s), s.ack_ms(0.99)))
                .collect(),
            dashed: false,
            color: names.len() + 2,
        },
    ];
    panel(&panels[3], "acknowledgement latency, ms", &latency)?;
    root.present().map_err(|e| e.to_string())
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    series: &[Series],
) -> Result<(), String> {
    let points = || series.iter().flat_map(|s| s.points.iter());
    let x_max = points().map(|p| p.0).fold(0.0_f64, f64::max).max(0.1);
    let y_max = points().map(|p| p.1).fold(0.0_f64, f64::max).max(1e-3) * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .light_line_style(WHITE)
        .draw()
        .map_err(|e| e.to_string())?;
    for s in series {
        let color = Palette99::pick(s.color).to_rgba();
        let style = ShapeStyle::from(color).stroke_width(2);
        let drawn = if s.dashed {
            chart.draw_series(DashedLineSeries::new(s.points.clone(), 6, 4, style))
        } else {
            chart.draw_series(LineSeries::new(s.points.clone(), style))
        };
        drawn
            .map_err(|e| e.to_string())?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}
