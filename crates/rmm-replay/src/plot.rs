//! Bytes in use and reserved over a replayed log, drawn with plotters as SVG or PNG (chosen
//! by the file's extension), one panel per log.

use std::fmt;
use std::fs;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

/// The most points a series is drawn with; longer series keep the maximum of each bucket, so
/// peaks stay visible.
pub const MAX_POINTS: usize = 2000;

/// Pixels of one panel.
const PANEL: (u32, u32) = (1000, 420);

/// One log's series.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    /// The panel's title (the log and the resource).
    pub title: String,
    /// Bytes in use after each replayed step.
    pub in_use: Vec<u64>,
    /// Bytes reserved by the resource after each replayed step.
    pub reserved: Vec<u64>,
    /// The size of the simulated memory, drawn as a limit.
    pub capacity: Option<u64>,
    /// The step (0-based) that failed, with its line, drawn as a marker.
    pub failed_at: Option<(usize, usize)>,
    /// What that line counts: a line of a CSV log or an entry of a PyTorch trace.
    pub position: crate::plan::Position,
}

/// The image formats, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.svg`
    Svg,
    /// `.png`
    Png,
}

impl Format {
    /// The format named by `path`'s extension (case-insensitive), if it is `.svg` or `.png`.
    #[must_use]
    pub fn of(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "svg" => Some(Format::Svg),
            "png" => Some(Format::Png),
            _ => None,
        }
    }
}

/// Why a plot was not written.
#[derive(Debug)]
pub enum PlotError {
    /// The extension is neither `.svg` nor `.png`.
    Format(PathBuf),
    /// Drawing failed.
    Draw(String),
    /// Writing the file failed.
    Io(PathBuf, io::Error),
}

impl fmt::Display for PlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlotError::Format(path) => write!(
                f,
                "{}: a plot is a .svg or a .png file (by its extension)",
                path.display()
            ),
            PlotError::Draw(e) => write!(f, "drawing the plot failed: {e}"),
            PlotError::Io(path, e) => write!(f, "{}: {e}", path.display()),
        }
    }
}

impl std::error::Error for PlotError {}

fn draw_error<E: std::error::Error + Send + Sync>(e: DrawingAreaErrorKind<E>) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Draws `panels` (one above the other) into `path`, SVG or PNG by its extension.
///
/// # Errors
///
/// [`PlotError`]: an extension other than `.svg` or `.png`, a drawing or a write failure.
pub fn draw(path: &Path, panels: &[Panel]) -> Result<(), PlotError> {
    let format = Format::of(path).ok_or_else(|| PlotError::Format(path.to_owned()))?;
    register_fonts()?;
    let rows = u32::try_from(panels.len().max(1))
        .unwrap_or(u32::MAX)
        .min(64);
    let size = (PANEL.0, PANEL.1 * rows);
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
                draw_panels(&root, panels)?;
                root.present().map_err(draw_error)?;
            }
            fs::write(path, svg).map_err(|e| PlotError::Io(path.to_owned(), e))
        }
        Format::Png => {
            let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
                draw_panels(&root, panels)?;
                root.present().map_err(draw_error)?;
            }
            write_png(path, size, &rgb)
        }
    }
}

/// The font of every text: DejaVu Sans, embedded (a PNG needs glyphs; plotters measures text
/// with the same font for SVG).
fn register_fonts() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Draw("the embedded font cannot be read".into()))
    }
}

fn write_png(path: &Path, size: (u32, u32), rgb: &[u8]) -> Result<(), PlotError> {
    let io_error = |e: io::Error| PlotError::Io(path.to_owned(), e);
    let png_error = |e: png::EncodingError| PlotError::Io(path.to_owned(), io::Error::other(e));
    let file = fs::File::create(path).map_err(io_error)?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), size.0, size.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(png_error)?;
    writer.write_image_data(rgb).map_err(png_error)?;
    writer.finish().map_err(png_error)
}

fn draw_panels<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    panels: &[Panel],
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(draw_error)?;
    if panels.is_empty() {
        return Ok(());
    }
    let areas = root.split_evenly((panels.len(), 1));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    Ok(())
}

/// A binary unit for values up to `max`: (divisor, name).
fn unit_for(max: u64) -> (f64, &'static str) {
    const UNITS: [(u32, &str); 5] = [(0, "B"), (10, "KiB"), (20, "MiB"), (30, "GiB"), (40, "TiB")];
    let mut chosen = UNITS[0];
    for unit in UNITS {
        if max >= 1u64 << unit.0 {
            chosen = unit;
        }
    }
    ((1u64 << chosen.0) as f64, chosen.1)
}

/// At most `max_points` points `(step, value)` (steps 1-based) of `series`: each bucket of
/// consecutive steps keeps its largest value, at its first step.
#[must_use]
pub fn downsample(series: &[u64], max_points: usize) -> Vec<(usize, u64)> {
    let max_points = max_points.max(1);
    let bucket = series.len().div_ceil(max_points).max(1);
    series
        .chunks(bucket)
        .enumerate()
        .map(|(i, chunk)| {
            let top = chunk.iter().copied().max().unwrap_or(0);
            (i * bucket + 1, top)
        })
        .collect()
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let steps = panel
        .in_use
        .len()
        .max(panel.reserved.len())
        .max(panel.failed_at.map_or(0, |(step, _)| step + 1));
    let top = panel
        .in_use
        .iter()
        .chain(&panel.reserved)
        .copied()
        .chain(panel.capacity)
        .max()
        .unwrap_or(0)
        .max(1);
    let (divisor, unit) = unit_for(top);
    let y_max = top as f64 / divisor * 1.08;
    let x_max = steps.max(1) as f64;

    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(draw_error)?;
    chart
        .configure_mesh()
        .x_desc("replayed event")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc(format!("bytes ({unit})"))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()
        .map_err(draw_error)?;

    let points = |series: &[u64]| -> Vec<(f64, f64)> {
        downsample(series, MAX_POINTS)
            .into_iter()
            .map(|(x, y)| (x as f64, y as f64 / divisor))
            .collect()
    };
    let reserved_color = RGBColor(214, 96, 39);
    let in_use_color = RGBColor(31, 100, 180);
    chart
        .draw_series(LineSeries::new(
            points(&panel.reserved),
            reserved_color.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label("reserved")
        .legend(move |(x, y)| {
            PathElement::new([(x, y), (x + 20, y)], reserved_color.stroke_width(2))
        });
    chart
        .draw_series(LineSeries::new(
            points(&panel.in_use),
            in_use_color.stroke_width(2),
        ))
        .map_err(draw_error)?
        .label("in use")
        .legend(move |(x, y)| {
            PathElement::new([(x, y), (x + 20, y)], in_use_color.stroke_width(2))
        });
    if let Some(capacity) = panel.capacity {
        let y = capacity as f64 / divisor;
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y), (x_max, y)],
                6,
                4,
                BLACK.mix(0.6).stroke_width(1),
            ))
            .map_err(draw_error)?
            .label("simulated memory")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.6)));
    }
    if let Some((step, line)) = panel.failed_at {
        let x = (step + 1) as f64;
        chart
            .draw_series(std::iter::once(PathElement::new(
                [(x, 0.0), (x, y_max)],
                RED.stroke_width(2),
            )))
            .map_err(draw_error)?
            .label(format!("ran out at {} {line}", panel.position.noun()))
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(draw_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_the_extension() {
        assert_eq!(Format::of(Path::new("a/b.svg")), Some(Format::Svg));
        assert_eq!(Format::of(Path::new("b.PNG")), Some(Format::Png));
        assert_eq!(Format::of(Path::new("b.jpg")), None);
        assert_eq!(Format::of(Path::new("svg")), None);
        let e = draw(Path::new("plot.gif"), &[]).unwrap_err();
        assert!(matches!(e, PlotError::Format(_)), "{e}");
    }

    #[test]
    fn downsampling_keeps_every_bucket_maximum() {
        assert_eq!(downsample(&[3, 1, 2], 10), [(1, 3), (2, 1), (3, 2)]);
        assert_eq!(downsample(&[1, 9, 2, 2, 7], 2), [(1, 9), (4, 7)]);
        assert!(downsample(&[], 5).is_empty());
        let long: Vec<u64> = (0..10_001).collect();
        let d = downsample(&long, MAX_POINTS);
        assert!(d.len() <= MAX_POINTS);
        assert_eq!(d.last().map(|p| p.1), Some(10_000));
    }

    #[test]
    fn units_fit_the_largest_value() {
        assert_eq!(unit_for(0), (1.0, "B"));
        assert_eq!(unit_for(1023), (1.0, "B"));
        assert_eq!(unit_for(1 << 20), ((1 << 20) as f64, "MiB"));
        assert_eq!(unit_for(80 << 30), ((1u64 << 30) as f64, "GiB"));
    }
}
