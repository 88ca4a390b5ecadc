//! `pagewise eval report`: the figures section of the README, rendered from `results/*/result.json`.
//!
//! Figures live in one place — the results an `eval` run wrote — and the README shows them
//! through this renderer, never as hand-copied numbers: each experiment's block names the
//! command, the mode, when it finished and the commit it ran, so a reader can tell which code
//! produced which figure and run it again.

use std::path::Path;

use anyhow::Context as _;
use serde_json::Value;

/// The markers around the generated part of a README.
pub const BEGIN: &str = "<!-- pagewise eval report: begin (generated; edit nothing inside) -->";
pub const END: &str = "<!-- pagewise eval report: end -->";

/// The Markdown of one experiment's `result.json`: a heading, where the figures come from,
/// the summary figures and the experiment's tables.
pub fn render_result(result: &Value) -> String {
    let name = result["name"].as_str().unwrap_or("?");
    let mode = result["mode"].as_str().unwrap_or("?").to_lowercase();
    let net = result["net"]["name"].as_str().map(|p| format!(" --net {p}")).unwrap_or_default();
    let mut out = format!("### `{name}`{}\n\n", net.replace(" --net ", ", network profile "));
    let when = result["finished_at"].as_str().unwrap_or("unknown time");
    let commit = result["machine"]["commit"].as_str().unwrap_or("unknown commit");
    let kernel = result["machine"]["kernel"].as_str().unwrap_or("?");
    out.push_str(&format!(
        "`pagewise eval {name} --{mode}{net}`, finished {when} with commit {commit} checked out, Linux {kernel}, {:.0} s.\n\n",
        result["duration_s"].as_f64().unwrap_or(0.0)
    ));
    if let Some(summary) = result["summary"].as_object().filter(|s| !s.is_empty()) {
        out.push_str("| figure | value |\n|---|---|\n");
        for (k, v) in summary {
            out.push_str(&format!("| `{k}` | {} |\n", format_value(v)));
        }
        out.push('\n');
    }
    for t in result["tables"].as_array().into_iter().flatten() {
        let title = t["title"].as_str().unwrap_or("");
        if !title.is_empty() {
            out.push_str(&format!("*{title}*\n\n"));
        }
        out.push_str(&table_markdown(&t["table"]));
        out.push('\n');
    }
    out
}

fn format_value(v: &Value) -> String {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.abs() >= 100.0 {
                format!("{f:.0}")
            } else {
                format!("{f:.3}")
            }
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table_markdown(t: &Value) -> String {
    let cells = |row: &Value| -> Vec<String> {
        row.as_array()
            .map(|r| {
                r.iter().map(|c| c.as_str().map_or_else(|| c.to_string(), str::to_string).replace('|', "\\|")).collect()
            })
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

/// Render every `DIR/NAME/result.json` in the order of `names` (experiments without results
/// are listed as not run).
pub fn render_dir(dir: &Path, names: &[&str]) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut missing = Vec::new();
    for name in names {
        let path = dir.join(name).join("result.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            missing.push(*name);
            continue;
        };
        let v: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        out.push_str(&render_result(&v));
    }
    if !missing.is_empty() {
        out.push_str(&format!(
            "Not run in this set of results: {}.\n",
            missing.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
        ));
    }
    Ok(out)
}

/// `readme` with the text between [`BEGIN`] and [`END`] replaced by `section`.
pub fn splice(readme: &str, section: &str) -> anyhow::Result<String> {
    let b = readme.find(BEGIN).with_context(|| format!("the README has no line {BEGIN:?}"))?;
    let e = readme.find(END).filter(|&e| e > b).with_context(|| format!("no {END:?} after the begin marker"))?;
    Ok(format!("{}{BEGIN}\n\n{}\n{}", &readme[..b], section.trim_end(), &readme[e..]))
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
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dates() {
        assert_eq!(utc_text(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_text(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_text(1_795_386_000), "2026-11-22 22:20 UTC");
    }

    #[test]
    fn a_result_renders_with_its_provenance() {
        let r = json!({
            "name": "demo", "mode": "Quick", "duration_s": 12.4, "finished_at": "2026-11-22 22:20 UTC",
            "machine": {"kernel": "6.18.0", "commit": "abc1234"},
            "summary": {"ratio": 0.98765, "events": 0, "big": 1234.5},
            "tables": [{"title": "T", "table": {"headers": ["a", "b|c"], "rows": [["1", "2"]]}}],
        });
        let md = render_result(&r);
        assert!(
            md.contains("`pagewise eval demo --quick`, finished 2026-11-22 22:20 UTC with commit abc1234 checked out"),
            "{md}"
        );
        assert!(
            md.contains("| `ratio` | 0.988 |") && md.contains("| `events` | 0 |") && md.contains("| `big` | 1234 |"),
            "{md}"
        );
        assert!(md.contains("| a | b\\|c |\n|---|---|\n| 1 | 2 |"), "{md}");
    }

    #[test]
    fn a_result_on_a_network_profile_says_so_in_its_heading_and_command() {
        let r = json!({"name": "dlm-fault", "mode": "Quick", "net": {"name": "25gbe"}, "summary": {}});
        let md = render_result(&r);
        assert!(md.starts_with("### `dlm-fault`, network profile 25gbe\n"), "{md}");
        assert!(md.contains("`pagewise eval dlm-fault --quick --net 25gbe`"), "{md}");
    }

    #[test]
    fn splicing_replaces_only_the_generated_part() {
        let readme = format!("intro\n{BEGIN}\nold\n{END}\noutro\n");
        let out = splice(&readme, "new\n").unwrap();
        assert_eq!(out, format!("intro\n{BEGIN}\n\nnew\n{END}\noutro\n"));
        assert_eq!(splice(&out, "new\n").unwrap(), out, "idempotent");
        assert!(splice("no markers", "x").is_err());
    }
}
