//! What an experiment produces: a table, named summary figures, plots and raw data, written to
//! `results/NAME/` as `result.json`, `table.md` and `plot.svg`.

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;
use serde::Serialize;

/// A table of strings with a header row.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Table {
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Table { headers: headers.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }

    /// GitHub-flavoured Markdown, columns padded so it also reads well in a terminal.
    pub fn markdown(&self) -> String {
        let cols = self.headers.len();
        let width = |c: usize| {
            self.rows
                .iter()
                .filter_map(|r| r.get(c))
                .chain(std::iter::once(&self.headers[c]))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(3)
                .max(3)
        };
        let widths: Vec<usize> = (0..cols).map(width).collect();
        let line = |cells: &[String]| {
            let padded: Vec<String> = (0..cols)
                .map(|c| {
                    let s = cells.get(c).map(String::as_str).unwrap_or("");
                    format!("{s:<w$}", w = widths[c])
                })
                .collect();
            format!("| {} |", padded.join(" | "))
        };
        let mut out = line(&self.headers);
        out.push('\n');
        out.push_str(&format!("|{}|", widths.iter().map(|w| "-".repeat(w + 2)).collect::<Vec<_>>().join("|")));
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
            out.push('\n');
        }
        out
    }
}

/// One line of a plot.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel of the SVG.
#[derive(Clone, Debug, Serialize)]
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub series: Vec<Series>,
}

impl Plot {
    pub fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Self {
        Plot { title: title.into(), x_label: x_label.into(), y_label: y_label.into(), log_x: false, series: Vec::new() }
    }

    pub fn log_x(mut self) -> Self {
        self.log_x = true;
        self
    }

    pub fn series(&mut self, name: impl Into<String>, points: Vec<(f64, f64)>) {
        self.series.push(Series { name: name.into(), points });
    }
}

/// Which way a figure may be off because runs entering it were cut off at a time budget and
/// counted as the budget (their true time is longer). Written next to the figure as
/// `KEY_censored` ([`Report::figure_censored`]); `pagewise eval report` shows such a figure as
/// a bound (≥ or ≤).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Censored {
    /// The true value is at least the one shown (a cut-off run is in a numerator).
    LowerBound,
    /// The true value is at most the one shown (a cut-off run is in a denominator).
    UpperBound,
    /// Cut-off runs on both sides: the figure bounds nothing.
    Unknown,
}

impl Censored {
    /// The censoring of a ratio `a / b` of times when runs of `a` (`numerator_cut`) or of `b`
    /// were counted as the budget; None when neither was.
    pub fn of_ratio(numerator_cut: bool, denominator_cut: bool) -> Option<Self> {
        match (numerator_cut, denominator_cut) {
            (false, false) => None,
            (true, false) => Some(Censored::LowerBound),
            (false, true) => Some(Censored::UpperBound),
            (true, true) => Some(Censored::Unknown),
        }
    }

    /// The largest of `figures` (NaNs ignored) and its censoring: a maximum whose largest term
    /// is exact or a lower bound is a lower bound as soon as any term is (the true maximum is
    /// at least that term's true value); with upper bounds only, it is an upper bound; else
    /// unknown. NaN when every figure is.
    pub fn of_max(figures: &[(f64, Option<Censored>)]) -> (f64, Option<Censored>) {
        Self::of_extreme(figures, |a, b| a > b, Censored::LowerBound, Censored::UpperBound)
    }

    /// The smallest of `figures`, the mirror of [`Censored::of_max`].
    pub fn of_min(figures: &[(f64, Option<Censored>)]) -> (f64, Option<Censored>) {
        Self::of_extreme(figures, |a, b| a < b, Censored::UpperBound, Censored::LowerBound)
    }

    /// `beats(a, b)`: a is more extreme than b. `toward`: the bound that pushes the extreme
    /// further (lower bound for a maximum); `away`: the other one.
    fn of_extreme(
        figures: &[(f64, Option<Censored>)],
        beats: impl Fn(f64, f64) -> bool,
        toward: Censored,
        away: Censored,
    ) -> (f64, Option<Censored>) {
        let Some(&(value, at)) =
            figures.iter().filter(|(v, _)| !v.is_nan()).reduce(|x, y| if beats(y.0, x.0) { y } else { x })
        else {
            return (f64::NAN, None);
        };
        let kinds: Vec<Censored> = figures.iter().filter(|(v, _)| !v.is_nan()).filter_map(|(_, c)| *c).collect();
        let open_ended = kinds.iter().any(|&c| c == toward || c == Censored::Unknown);
        let censored = if open_ended {
            match at {
                None => Some(toward),
                Some(c) if c == toward => Some(toward),
                Some(_) => Some(Censored::Unknown),
            }
        } else if kinds.contains(&away) {
            Some(away)
        } else {
            None
        };
        (value, censored)
    }

    /// How a figure that may be a bound reads in a table cell: `≥ `, `≤ `, `? ` (a bound of
    /// nothing) or nothing, put before the value.
    pub fn mark(c: Option<Censored>) -> &'static str {
        match c {
            None => "",
            Some(Censored::LowerBound) => "≥ ",
            Some(Censored::UpperBound) => "≤ ",
            Some(Censored::Unknown) => "? ",
        }
    }

    /// The summary's spelling: `lower_bound`, `upper_bound`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Censored::LowerBound => "lower_bound",
            Censored::UpperBound => "upper_bound",
            Censored::Unknown => "unknown",
        }
    }
}

/// Everything an experiment reports.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Named figures (ratios first, then the absolute values behind them).
    pub summary: serde_json::Map<String, serde_json::Value>,
    pub tables: Vec<(String, Table)>,
    pub plots: Vec<Plot>,
    /// Raw per-repetition data for anyone who wants to recompute.
    pub data: serde_json::Value,
    /// What was measured how, caveats, targets met or missed.
    pub notes: Vec<String>,
}

impl Report {
    pub fn figure(&mut self, key: &str, value: impl Into<serde_json::Value>) {
        self.summary.insert(key.to_string(), value.into());
    }

    /// A figure computed from runs some of which may have been cut off at a time budget:
    /// `key`, and `key_censored` (`lower_bound`, `upper_bound` or `unknown`) when they were.
    pub fn figure_censored(&mut self, key: &str, value: f64, censored: Option<Censored>) {
        self.figure(key, value);
        if let Some(c) = censored {
            self.figure(&format!("{key}_censored"), c.as_str());
        }
    }

    pub fn table(&mut self, title: impl Into<String>, table: Table) {
        self.tables.push((title.into(), table));
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// The Markdown document: tables, summary and notes.
    pub fn markdown(&self, name: &str, header: &str) -> String {
        let mut out = format!("# {name}\n\n{header}\n\n");
        for (title, t) in &self.tables {
            if !title.is_empty() {
                out.push_str(&format!("## {title}\n\n"));
            }
            out.push_str(&t.markdown());
            out.push('\n');
        }
        if !self.summary.is_empty() {
            out.push_str("## Summary\n\n");
            for (k, v) in &self.summary {
                let shown = match v.as_f64() {
                    Some(f) if v.is_f64() => format!("{f:.4}"),
                    _ => v.to_string(),
                };
                out.push_str(&format!("- `{k}`: {shown}\n"));
            }
            out.push('\n');
        }
        for n in &self.notes {
            out.push_str(&format!("> {n}\n"));
        }
        out
    }
}

fn finite(v: f64) -> bool {
    v.is_finite()
}

/// Draw every plot as a panel of one SVG.
pub fn write_svg(path: &Path, plots: &[Plot]) -> anyhow::Result<()> {
    if plots.is_empty() {
        return Ok(());
    }
    let cols = if plots.len() == 1 { 1 } else { 2 };
    let rows = plots.len().div_ceil(cols);
    let root = SVGBackend::new(path, (640 * cols as u32, 420 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((rows, cols));
    for (plot, area) in plots.iter().zip(areas.iter()) {
        draw_panel(area, plot)?;
    }
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>, plot: &Plot) -> anyhow::Result<()> {
    let pts: Vec<(f64, f64)> =
        plot.series.iter().flat_map(|s| s.points.iter().copied()).filter(|(x, y)| finite(*x) && finite(*y)).collect();
    if pts.is_empty() {
        return Ok(());
    }
    let (mut x0, mut x1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), (x, _)| (a.min(*x), b.max(*x)));
    let (mut y0, mut y1) = pts.iter().fold((f64::MAX, f64::MIN), |(a, b), (_, y)| (a.min(*y), b.max(*y)));
    if x0 == x1 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    y0 = y0.min(0.0);
    if y0 == y1 {
        y1 += 1.0;
    }
    y1 += (y1 - y0) * 0.08;
    let palette = [&BLUE, &RED, &GREEN, &MAGENTA, &CYAN, &BLACK];
    let mut builder = ChartBuilder::on(area);
    builder.caption(&plot.title, ("sans-serif", 18)).margin(12).x_label_area_size(36).y_label_area_size(60);
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart.configure_mesh().x_desc(plot.x_label.as_str()).y_desc(plot.y_label.as_str()).draw()?;
            for (i, s) in plot.series.iter().enumerate() {
                let color = palette[i % palette.len()];
                let points: Vec<(f64, f64)> =
                    s.points.iter().copied().filter(|(x, y)| finite(*x) && finite(*y)).collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
            }
            chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;
        }};
    }
    if plot.log_x && x0 > 0.0 {
        draw!(builder.build_cartesian_2d((x0..x1).log_scale(), y0..y1)?);
    } else {
        draw!(builder.build_cartesian_2d(x0..x1, y0..y1)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_table_is_aligned() {
        let mut t = Table::new(["size", "ratio"]);
        t.row(["64 MiB", "0.98"]);
        t.row(["1 GiB", "0.74"]);
        let md = t.markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines.iter().all(|l| l.chars().count() == lines[0].chars().count()));
        assert!(lines[1].starts_with("|--"));
    }

    #[test]
    fn censoring_of_ratios_and_extremes() {
        use Censored::*;
        assert_eq!(Censored::of_ratio(false, false), None);
        assert_eq!(Censored::of_ratio(true, false), Some(LowerBound));
        assert_eq!(Censored::of_ratio(false, true), Some(UpperBound));
        assert_eq!(Censored::of_ratio(true, true), Some(Unknown));
        // The largest term exact, another a lower bound: the true maximum is at least it.
        assert_eq!(Censored::of_max(&[(1.2, None), (0.9, Some(LowerBound))]), (1.2, Some(LowerBound)));
        // The largest term an upper bound while another is open-ended: nothing is known.
        assert_eq!(Censored::of_max(&[(1.2, Some(UpperBound)), (0.9, Some(LowerBound))]), (1.2, Some(Unknown)));
        // Upper bounds only: the maximum is at most the largest shown.
        assert_eq!(Censored::of_max(&[(1.2, Some(UpperBound)), (0.9, None)]), (1.2, Some(UpperBound)));
        assert_eq!(Censored::of_max(&[(1.2, None), (f64::NAN, Some(LowerBound))]), (1.2, None));
        assert!(Censored::of_max(&[(f64::NAN, None)]).0.is_nan());
        // The minimum mirrors it.
        assert_eq!(Censored::of_min(&[(0.5, None), (0.9, Some(UpperBound))]), (0.5, Some(UpperBound)));
        assert_eq!(Censored::of_min(&[(0.5, Some(LowerBound)), (0.9, None)]), (0.5, Some(LowerBound)));
        let mut r = Report::default();
        r.figure_censored("a", 1.0, None);
        r.figure_censored("b", 2.0, Some(LowerBound));
        assert_eq!(r.summary.get("a_censored"), None);
        assert_eq!(r.summary["b_censored"], "lower_bound");
    }

    #[test]
    fn svg_is_written() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("svg-test").unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        let mut p = Plot::new("t", "x", "y").log_x();
        p.series("a", vec![(1.0, 2.0), (10.0, 3.0)]);
        p.series("b", vec![(1.0, 1.0), (10.0, f64::NAN)]);
        let path = dir.join("plot.svg");
        write_svg(&path, &[p.clone(), p]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("<svg") && svg.contains("polyline"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
