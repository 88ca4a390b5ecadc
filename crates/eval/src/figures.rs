//! `pagewise eval report`: `docs/FIGURES.md` and the same as one self-contained HTML page,
//! rendered from the results `eval` runs wrote.
//!
//! Figures live in one place — `results/NAME/result.json` (quick mode) and
//! `results/NAME-full/result.json` (full mode, [`crate::harness::result_dir`]) — and the docs show
//! them through this renderer, never as hand-copied numbers. The document opens with the
//! headlines ([`crate::headlines`]): one line per goal, with the quick and the full run's value
//! side by side, each with its interval, met or not, and the command that reproduces it. Then
//! where each result came from (command, mode, finish time, commit), and a section per
//! experiment with its summary (quick and full side by side), tables, notes and plot.
//!
//! The Markdown links each plot; the HTML page (`--html`) carries the plots inline (the SVG each
//! run wrote), so the page is one file that needs nothing else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde_json::Value;

use crate::harness::result_dir;
use crate::headlines::{Goal, Headline, Verdict, HEADLINES};
use crate::{Censored, Mode};

/// The results of every experiment found, by name and mode.
pub struct Results {
    dir: PathBuf,
    runs: BTreeMap<(String, Mode), Value>,
}

fn mode_of(v: &Value) -> Option<Mode> {
    match v["mode"].as_str()?.to_ascii_lowercase().as_str() {
        "quick" => Some(Mode::Quick),
        "full" => Some(Mode::Full),
        _ => None,
    }
}

impl Results {
    /// Read `DIR/NAME/result.json` and `DIR/NAME-full/result.json` of each experiment in
    /// `names` that has them. A result is filed under the mode its own `mode` field names.
    pub fn load(dir: &Path, names: &[&str]) -> anyhow::Result<Self> {
        let mut runs = BTreeMap::new();
        for name in names {
            for mode in [Mode::Quick, Mode::Full] {
                let path = result_dir(dir, name, mode).join("result.json");
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                let mode = mode_of(&v).with_context(|| format!("{}: no mode \"quick\" or \"full\"", path.display()))?;
                runs.insert((name.to_string(), mode), v);
            }
        }
        Ok(Results { dir: dir.to_path_buf(), runs })
    }

    /// Take each experiment and mode that `dir` has no result for from `archive`, where
    /// [`Results::keep`] left the results a document was last rendered from. Results live on
    /// the machine that ran them, full runs take hours, and a new machine starts with none:
    /// so one experiment run again re-renders the document without losing the others'.
    /// Returns how many were taken.
    pub fn fill_from(&mut self, archive: &Path, names: &[&str]) -> anyhow::Result<usize> {
        let mut taken = 0;
        for name in names {
            for mode in [Mode::Quick, Mode::Full] {
                if self.runs.contains_key(&(name.to_string(), mode)) {
                    continue;
                }
                let path = archived(archive, name, mode);
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                anyhow::ensure!(mode_of(&v) == Some(mode), "{}: not a {} result", path.display(), mode_word(mode));
                self.runs.insert((name.to_string(), mode), v);
                taken += 1;
            }
        }
        Ok(taken)
    }

    /// Keep every result held in `archive` (`NAME.json`, `NAME-full.json`), without its raw
    /// `data`: what the document shows, and where each figure came from.
    pub fn keep(&self, archive: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(archive).with_context(|| format!("creating {}", archive.display()))?;
        for ((name, mode), v) in &self.runs {
            let mut kept = v.clone();
            if let Some(o) = kept.as_object_mut() {
                o.remove("data");
            }
            let path = archived(archive, name, *mode);
            std::fs::write(&path, serde_json::to_string_pretty(&kept)? + "\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// From results already read (tests).
    pub fn from_values(dir: &Path, values: impl IntoIterator<Item = Value>) -> Self {
        let runs =
            values.into_iter().filter_map(|v| Some(((v["name"].as_str()?.to_string(), mode_of(&v)?), v))).collect();
        Results { dir: dir.to_path_buf(), runs }
    }

    fn get(&self, name: &str, mode: Mode) -> Option<&Value> {
        self.runs.get(&(name.to_string(), mode))
    }

    fn plot_path(&self, name: &str, mode: Mode) -> PathBuf {
        result_dir(&self.dir, name, mode).join("plot.svg")
    }
}

/// Where [`Results::keep`] files one experiment's result in one mode.
fn archived(archive: &Path, name: &str, mode: Mode) -> PathBuf {
    let dir = result_dir(Path::new(""), name, mode);
    archive.join(format!("{}.json", dir.display()))
}

/// The archive beside a figures document: `docs/results/` for `docs/FIGURES.md`.
pub fn archive_beside(figures: &Path) -> PathBuf {
    figures.parent().unwrap_or(Path::new(".")).join("results")
}

/// A piece of the document: Markdown, or a plot (linked in Markdown, inline in HTML).
enum Block {
    Markdown(String),
    Plot { caption: String, svg: PathBuf },
}

/// The figures document.
pub struct Document {
    blocks: Vec<Block>,
}

/// How a figure is shown: numbers with 3 decimals below 100, none above.
pub fn format_value(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => format_number(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => s.clone(),
        Value::Null => "—".into(),
        other => other.to_string(),
    }
}

fn format_number(f: f64) -> String {
    if f.abs() >= 100.0 {
        format!("{f:.0}")
    } else {
        format!("{f:.3}")
    }
}

/// One headline's value in one result, as far as it is there.
enum Measured {
    /// The experiment does not exist in this build.
    NoExperiment,
    /// It exists but has no result in this mode.
    NotRun,
    /// The result has no such key, or its value is null (no run gave a number).
    NoValue,
    Value {
        value: f64,
        interval: Option<(f64, f64, &'static str)>,
        censored: Option<Censored>,
    },
}

fn censored_of(s: &str) -> Option<Censored> {
    match s {
        "lower_bound" => Some(Censored::LowerBound),
        "upper_bound" => Some(Censored::UpperBound),
        "unknown" => Some(Censored::Unknown),
        _ => None,
    }
}

fn measure(hl: &Headline, result: Option<&Value>, exists: bool) -> Measured {
    if !exists {
        return Measured::NoExperiment;
    }
    let Some(r) = result else { return Measured::NotRun };
    let summary = &r["summary"];
    let num = |k: &str| summary[k].as_f64();
    let Some(value) = num(hl.key) else { return Measured::NoValue };
    let key = hl.key;
    let interval = match (num(&format!("{key}_ci95_low")), num(&format!("{key}_ci95_high"))) {
        (Some(lo), Some(hi)) => Some((lo, hi, "95% CI")),
        _ => match (num(&format!("{key}_min")), num(&format!("{key}_max"))) {
            (Some(lo), Some(hi)) => Some((lo, hi, "range")),
            _ => None,
        },
    };
    let censored = summary[format!("{key}_censored")].as_str().and_then(censored_of);
    Measured::Value { value, interval, censored }
}

/// The value cell and the verdict cell of one headline in one mode.
fn headline_cells(hl: &Headline, m: &Measured) -> (String, String) {
    match m {
        Measured::NoExperiment => ("not measured (no experiment yet)".into(), String::new()),
        Measured::NotRun => ("not run".into(), String::new()),
        Measured::NoValue => ("no value in this run".into(), String::new()),
        Measured::Value { value, interval, censored } => {
            let mut cell = format!("{}{}", Censored::mark(*censored), format_number(*value));
            if let Some((lo, hi, kind)) = interval {
                cell.push_str(&format!(" ({kind} {}–{})", format_number(*lo), format_number(*hi)));
            }
            if censored.is_some() {
                cell.push_str(" (a bound: runs cut off at the time budget)");
            }
            let crosses = interval.is_some_and(|(lo, hi, _)| !(hl.goal.holds(lo) && hl.goal.holds(hi)));
            let verdict = match hl.goal.verdict(*value, *censored) {
                Verdict::Met if crosses => "met (its interval crosses the goal)".to_string(),
                Verdict::Met => "met".into(),
                Verdict::Missed => "**missed**".into(),
                Verdict::Unknown => "cannot tell (bound)".into(),
                Verdict::NoGoal => String::new(),
            };
            (cell, verdict)
        }
    }
}

/// GitHub's anchor of a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces as `-`.
pub fn slug(text: &str) -> String {
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn escape_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn table_markdown(t: &Value) -> String {
    let cells = |row: &Value| -> Vec<String> {
        row.as_array()
            .map(|r| r.iter().map(|c| escape_cell(&c.as_str().map_or_else(|| c.to_string(), str::to_string))).collect())
            .unwrap_or_default()
    };
    let headers = cells(&t["headers"]);
    if headers.is_empty() {
        return String::new();
    }
    let mut out = format!("| {} |\n|{}\n", headers.join(" | "), "---|".repeat(headers.len()));
    for row in t["rows"].as_array().into_iter().flatten() {
        out.push_str(&format!("| {} |\n", cells(row).join(" | ")));
    }
    out
}

fn mode_word(mode: Mode) -> &'static str {
    match mode {
        Mode::Quick => "quick",
        Mode::Full => "full",
    }
}

/// `pagewise eval NAME --MODE`, finished …, commit …, Linux …, N s.
fn provenance(name: &str, mode: Mode, r: &Value) -> String {
    format!(
        "`pagewise eval {name} --{}`, finished {} with commit {} checked out, Linux {}, {:.0} s",
        mode_word(mode),
        r["finished_at"].as_str().unwrap_or("at an unknown time"),
        r["machine"]["commit"].as_str().unwrap_or("unknown"),
        r["machine"]["kernel"].as_str().unwrap_or("?"),
        r["duration_s"].as_f64().unwrap_or(0.0)
    ) + r["kept_as"].as_str().map(|k| format!(" ({k})")).as_deref().unwrap_or("")
}

/// The document for the experiments `names` (in that order; `exists` tells whether a name is an
/// experiment of this build, for headlines of experiments still to come).
pub fn document(results: &Results, names: &[&str], exists: impl Fn(&str) -> bool) -> Document {
    let mut blocks = Vec::new();
    let mut md = String::new();
    md.push_str(
        "# Figures\n\n\
         Generated by `pagewise eval report --figures docs/FIGURES.md` (`make report`) from the results `pagewise eval` \
         wrote: `results/NAME/result.json` for quick mode (`make eval`), `results/NAME-full/result.json` for full mode \
         (the papers' sizes where the machine allows); an experiment and mode not run again since comes from \
         `docs/results/`, where each rendering keeps the results it showed. Do not edit: run the experiments and render \
         again. \
         `pagewise eval report --html` renders the same with the plots into one page (`results/report.html`).\n\n\
         Every figure is a ratio between configurations measured side by side in one run, repetitions interleaved \
         (A B A B …), unless its name says otherwise; absolute times come from a 2-core VM and move between machines. \
         An interval is the 95% interval of a median where the experiment gives one (`KEY_ci95_low`/`_high`), else the \
         range over repetitions (`KEY_min`/`_max`). `≥`/`≤` mark bounds: runs cut off at a time budget were counted as \
         the budget (`KEY_censored`). A figure no run measured says so; nothing is filled in.\n\n",
    );
    md.push_str("## Headlines\n\n");
    md.push_str(
        "| system | figure | goal | quick run | met? | full run | met? | reproduce |\n|---|---|---|---|---|---|---|---|\n",
    );
    for hl in HEADLINES {
        let exists_now = exists(hl.experiment);
        let (quick, quick_verdict) =
            headline_cells(hl, &measure(hl, results.get(hl.experiment, Mode::Quick), exists_now));
        let (full, full_verdict) = headline_cells(hl, &measure(hl, results.get(hl.experiment, Mode::Full), exists_now));
        let goal = if hl.goal == Goal::Report { hl.goal.text() } else { format!("{} ({})", hl.goal.text(), hl.source) };
        let reproduce = if exists_now {
            format!("[`pagewise eval {0}`](#{1}) `--quick` / `--full`", hl.experiment, slug(hl.experiment))
        } else {
            format!("`pagewise eval {}` (to come)", hl.experiment)
        };
        md.push_str(&format!(
            "| {} | {} (`{}`) | {} | {} | {} | {} | {} | {} |\n",
            hl.system,
            escape_cell(hl.what),
            hl.key,
            goal,
            quick,
            quick_verdict,
            full,
            full_verdict,
            reproduce
        ));
    }
    md.push_str("\n## Where the figures come from\n\n| experiment | mode | finished | commit | Linux | took |\n|---|---|---|---|---|---|\n");
    let mut missing: BTreeMap<Mode, Vec<String>> = BTreeMap::new();
    for name in names {
        for mode in [Mode::Quick, Mode::Full] {
            match results.get(name, mode) {
                Some(r) => md.push_str(&format!(
                    "| [`{name}`](#{}) | {} | {} | {} | {} | {:.0} s |\n",
                    slug(name),
                    mode_word(mode),
                    r["finished_at"].as_str().unwrap_or("?"),
                    r["machine"]["commit"].as_str().unwrap_or("?"),
                    r["machine"]["kernel"].as_str().unwrap_or("?"),
                    r["duration_s"].as_f64().unwrap_or(0.0)
                )),
                None => missing.entry(mode).or_default().push(format!("`{name}`")),
            }
        }
    }
    for (mode, names_missing) in &missing {
        let all = names_missing.len() == names.len();
        md.push_str(&format!(
            "\nNo {} results{}{}.\n",
            mode_word(*mode),
            if all { " in this set" } else { " for: " },
            if all { String::new() } else { names_missing.join(", ") }
        ));
    }
    for name in names {
        let quick = results.get(name, Mode::Quick);
        let full = results.get(name, Mode::Full);
        md.push_str(&format!("\n## `{name}`\n\n"));
        if let Some(d) = quick.or(full).and_then(|r| r["description"].as_str()) {
            md.push_str(&format!("{d}\n\n"));
        }
        if quick.is_none() && full.is_none() {
            md.push_str(&format!("Not run in this set of results: `pagewise eval {name} --quick` measures it.\n"));
            continue;
        }
        for (mode, r) in [(Mode::Quick, quick), (Mode::Full, full)] {
            if let Some(r) = r {
                md.push_str(&format!("- {}.\n", provenance(name, mode, r)));
            }
        }
        md.push('\n');
        // The summary, quick and full side by side.
        let keys: Vec<&String> = {
            let mut k: Vec<&String> = Vec::new();
            for r in [quick, full].into_iter().flatten() {
                for key in r["summary"].as_object().into_iter().flat_map(|s| s.keys()) {
                    if !k.contains(&key) {
                        k.push(key);
                    }
                }
            }
            k
        };
        if !keys.is_empty() {
            md.push_str("| figure | quick | full |\n|---|---|---|\n");
            for key in keys {
                let cell = |r: Option<&Value>| match r {
                    None => "not run".to_string(),
                    Some(r) => r["summary"].get(key.as_str()).map_or("—".into(), format_value),
                };
                md.push_str(&format!("| `{key}` | {} | {} |\n", escape_cell(&cell(quick)), escape_cell(&cell(full))));
            }
            md.push('\n');
        }
        for (mode, r) in [(Mode::Quick, quick), (Mode::Full, full)] {
            let Some(r) = r else { continue };
            let word = mode_word(mode);
            for t in r["tables"].as_array().into_iter().flatten() {
                let title = t["title"].as_str().unwrap_or("");
                md.push_str(&format!("*{word}{}{title}*\n\n", if title.is_empty() { "" } else { ": " }));
                md.push_str(&table_markdown(&t["table"]));
                md.push('\n');
            }
            for n in r["notes"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                md.push_str(&format!("> {word}: {n}\n>\n"));
            }
            md.push('\n');
            let svg = results.plot_path(name, mode);
            if r["plots"].as_array().is_some_and(|p| !p.is_empty()) {
                blocks.push(Block::Markdown(std::mem::take(&mut md)));
                blocks.push(Block::Plot { caption: format!("{name}, {word} run"), svg });
            }
        }
    }
    blocks.push(Block::Markdown(md));
    Document { blocks }
}

impl Document {
    /// The Markdown (docs/FIGURES.md): plots as a line naming their file.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        for b in &self.blocks {
            match b {
                Block::Markdown(s) => out.push_str(s),
                Block::Plot { caption, svg } => out.push_str(&format!(
                    "Plot ({caption}): `{}` after a run, inline in `pagewise eval report --html`.\n\n",
                    svg.display()
                )),
            }
        }
        out
    }

    /// One self-contained HTML page: the same text, headings with GitHub's anchors, the plots'
    /// SVG inline (a plot whose file is missing is named as missing).
    pub fn html(&self) -> String {
        let mut body = String::new();
        for b in &self.blocks {
            match b {
                Block::Markdown(s) => body.push_str(&markdown_to_html(s)),
                Block::Plot { caption, svg } => match std::fs::read_to_string(svg) {
                    Ok(text) => body.push_str(&format!(
                        "<figure class=\"plot\">{}<figcaption>{}</figcaption></figure>\n",
                        inline_svg(&text),
                        escape_html(caption)
                    )),
                    Err(_) => body.push_str(&format!(
                        "<p class=\"missing\">Plot ({}): {} is missing.</p>\n",
                        escape_html(caption),
                        escape_html(&svg.display().to_string())
                    )),
                },
            }
        }
        format!(
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
             <title>Pagewise figures</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n"
        )
    }
}

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;\
line-height:1.45;color:#222}table{border-collapse:collapse;margin:1em 0;font-size:0.9em;display:block;\
overflow-x:auto}th,td{border:1px solid #ccc;padding:0.25em 0.5em;text-align:left;vertical-align:top}\
th{background:#f3f3f3}code{background:#f5f5f5;padding:0 0.2em}blockquote{color:#555;border-left:3px solid #ddd;\
margin:0.5em 0;padding-left:1em}figure.plot svg{max-width:100%;height:auto}figcaption{color:#555;font-size:0.9em}\
.missing{color:#a00}";

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// An SVG file's text without its XML prolog, ready to sit inside HTML.
fn inline_svg(text: &str) -> &str {
    match (text.trim_start().starts_with("<?xml"), text.find("?>")) {
        (true, Some(end)) => text[end + 2..].trim_start(),
        _ => text.trim_start(),
    }
}

/// CommonMark with tables to HTML; each heading gets the id GitHub would give it, so the
/// headline table's links work in the page too.
fn markdown_to_html(md: &str) -> String {
    use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
    let events: Vec<Event> = Parser::new_ext(md, Options::ENABLE_TABLES).collect();
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        if let Event::Start(Tag::Heading { level, classes, attrs, .. }) = &events[i] {
            let mut text = String::new();
            let mut j = i + 1;
            while j < events.len() && !matches!(events[j], Event::End(TagEnd::Heading(_))) {
                if let Event::Text(t) | Event::Code(t) = &events[j] {
                    text.push_str(t);
                }
                j += 1;
            }
            out.push(Event::Start(Tag::Heading {
                level: *level,
                id: Some(slug(&text).into()),
                classes: classes.clone(),
                attrs: attrs.clone(),
            }));
            i += 1;
            continue;
        }
        out.push(events[i].clone());
        i += 1;
    }
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, out.into_iter());
    html
}

/// Civil UTC date and time of a Unix time, as `YYYY-MM-DD HH:MM UTC` (H. Hinnant's
/// days-from-civil inverse; no time-zone database needed).
pub fn utc_text(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", secs / 3600, secs % 3600 / 60)
}

#[cfg(test)]
mod tests;
