use super::*;
use serde_json::json;

fn result(name: &str, mode: &str, summary: Value) -> Value {
    json!({
        "name": name, "description": format!("{name}: what it compares"), "mode": mode, "duration_s": 12.4,
        "finished_at": "2026-11-22 22:20 UTC", "machine": {"kernel": "6.18.0", "commit": "abc1234"},
        "summary": summary,
        "tables": [{"title": "T", "table": {"headers": ["a", "b|c"], "rows": [["1", "2"]]}}],
        "plots": [{"title": "p", "x_label": "x", "y_label": "y", "log_x": false, "series": []}],
        "notes": ["a note"],
    })
}

fn line_of<'a>(md: &'a str, key: &str) -> &'a str {
    md.lines().find(|l| l.contains(&format!("(`{key}`)"))).unwrap_or_else(|| panic!("no line for {key}:\n{md}"))
}

fn sample() -> Results {
    Results::from_values(
        Path::new("/nonexistent-results"),
        [
            result(
                "hps-micro",
                "quick",
                json!({"hps_vs_thp_throughput_min": 0.991, "hps_vs_thp_rss_increase_max": 0.2,
                       "rounds_to_steady_max": 9.0}),
            ),
            result("hps-micro", "full", json!({"hps_vs_thp_throughput_min": 0.985})),
            result(
                "dlm-autotune",
                "quick",
                json!({"auto_vs_best_fixed_max": 1.05, "auto_vs_best_fixed_max_censored": "lower_bound",
                       "auto_vs_128k_at_5pct": 0.06, "auto_vs_128k_at_5pct_censored": "upper_bound"}),
            ),
            result(
                "dlm-fault",
                "quick",
                json!({"fault_vs_busy_pingpong_16k": 1.235, "fault_vs_busy_pingpong_16k_ci95_low": 1.227,
                       "fault_vs_busy_pingpong_16k_ci95_high": 1.240, "stream_vs_tcp_ratio": 0.781,
                       "stream_vs_tcp_ratio_ci95_low": 0.69, "stream_vs_tcp_ratio_ci95_high": 0.956,
                       "fault_vs_busy_pingpong_max": null}),
            ),
            result(
                "dlm-vs-swap",
                "quick",
                json!({"dlm_vs_zram_time": 0.21, "dlm_vs_zram_time_min": 0.13, "dlm_vs_zram_time_max": 0.5}),
            ),
        ],
    )
}

fn sample_document() -> Document {
    let names = ["hps-micro", "dlm-fault", "dlm-autotune", "dlm-vs-swap", "reclaim-split"];
    document(&sample(), &names, |n| names.contains(&n))
}

#[test]
fn dates() {
    assert_eq!(utc_text(0), "1970-01-01 00:00 UTC");
    assert_eq!(utc_text(951_782_400), "2000-02-29 00:00 UTC");
    assert_eq!(utc_text(1_795_386_000), "2026-11-22 22:20 UTC");
}

#[test]
fn every_headline_has_one_line_in_the_first_table() {
    let md = sample_document().markdown();
    let first_table = md.split("## Headlines").nth(1).unwrap().split("\n## ").next().unwrap();
    let rows = first_table.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| system")).count();
    assert_eq!(rows, HEADLINES.len(), "{first_table}");
}

#[test]
fn headlines_show_value_interval_verdict_and_command() {
    let md = sample_document().markdown();
    // Quick and full side by side; met; the command linked to the experiment's section.
    let l = line_of(&md, "hps_vs_thp_throughput_min");
    assert!(l.contains("| ≥ 0.98 (issue 4) | 0.991 | met | 0.985 | met |"), "{l}");
    assert!(l.contains("[`pagewise eval hps-micro`](#hps-micro) `--quick` / `--full`"), "{l}");
    assert!(line_of(&md, "hps_vs_thp_rss_increase_max").contains("| 0.200 | **missed** | no value in this run |"));
    // A 95% interval, and a met value whose interval crosses the goal.
    let l = line_of(&md, "fault_vs_busy_pingpong_16k");
    assert!(l.contains("1.235 (95% CI 1.227–1.240) | met |"), "{l}");
    let l = line_of(&md, "stream_vs_tcp_ratio");
    assert!(l.contains("0.781 (95% CI 0.690–0.956) | met (its interval crosses the goal) |"), "{l}");
    // A null value: measured, but no number.
    assert!(line_of(&md, "fault_vs_busy_pingpong_max").contains("| no value in this run |"));
    // Bounds: a lower bound below an at-most goal cannot tell; an upper bound below it meets it.
    let l = line_of(&md, "auto_vs_best_fixed_max");
    assert!(l.contains("≥ 1.050 (a bound: runs cut off at the time budget) | cannot tell (bound) |"), "{l}");
    assert!(line_of(&md, "auto_vs_128k_at_5pct").contains("≤ 0.060 (a bound: runs cut off at the time budget) | met |"));
    // A range over repetitions; a goal-less figure has no verdict.
    let l = line_of(&md, "dlm_vs_zram_time");
    assert!(l.contains("| — (reported) | 0.210 (range 0.130–0.500) |  | not run |"), "{l}");
    // An experiment of this build without results, and one that does not exist yet.
    assert!(line_of(&md, "slab_heavy_time_ratio").contains("| not run |  | not run |"));
    let l = md.lines().find(|l| l.contains("(`redundant_vs_none_time`)")).unwrap();
    assert!(
        l.contains("not measured (no experiment yet)") && l.contains("`pagewise eval dlm-failover` (to come)"),
        "{l}"
    );
}

#[test]
fn sections_give_provenance_and_quick_and_full_side_by_side() {
    let md = sample_document().markdown();
    assert!(
        md.contains(
            "- `pagewise eval hps-micro --quick`, finished 2026-11-22 22:20 UTC with commit abc1234 checked out"
        ),
        "{md}"
    );
    assert!(md.contains("- `pagewise eval hps-micro --full`, finished"));
    assert!(md.contains("| `hps_vs_thp_throughput_min` | 0.991 | 0.985 |"), "{md}");
    assert!(md.contains("| `rounds_to_steady_max` | 9.000 | — |"), "{md}");
    assert!(md.contains("| `fault_vs_busy_pingpong_16k` | 1.235 | not run |"), "{md}");
    assert!(md.contains("*quick: T*\n\n| a | b\\|c |\n|---|---|\n| 1 | 2 |"), "{md}");
    assert!(md.contains("> quick: a note"));
    assert!(md.contains("Plot (hps-micro, full run): `/nonexistent-results/hps-micro-full/plot.svg`"), "{md}");
    assert!(md.contains("## `reclaim-split`\n\nNot run in this set of results"), "{md}");
    assert!(md.contains("| [`dlm-fault`](#dlm-fault) | quick | 2026-11-22 22:20 UTC | abc1234 |"), "{md}");
    assert!(md.contains("No quick results for: `reclaim-split`.\n"), "{md}");
    assert!(md.contains("No full results for: `dlm-fault`, `dlm-autotune`, `dlm-vs-swap`, `reclaim-split`.\n"), "{md}");
}

#[test]
fn the_html_page_is_self_contained_with_plots_inline() {
    let dir = std::env::temp_dir().join(format!("pw-figures-html-{}", std::process::id()));
    let plot_dir = result_dir(&dir, "hps-micro", Mode::Quick);
    std::fs::create_dir_all(&plot_dir).unwrap();
    std::fs::write(
        plot_dir.join("plot.svg"),
        "<?xml version=\"1.0\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"><polyline points=\"0,0 1,1\"/></svg>\n",
    )
    .unwrap();
    let results = Results::load(&dir, &["hps-micro"]).unwrap();
    assert!(results.runs.is_empty(), "no result.json yet");
    std::fs::write(plot_dir.join("result.json"), result("hps-micro", "Quick", json!({"a": 1.0})).to_string()).unwrap();
    let full_dir = result_dir(&dir, "hps-micro", Mode::Full);
    std::fs::create_dir_all(&full_dir).unwrap();
    std::fs::write(full_dir.join("result.json"), result("hps-micro", "full", json!({"a": 2.0})).to_string()).unwrap();
    let results = Results::load(&dir, &["hps-micro"]).unwrap();
    assert_eq!(results.runs.len(), 2);
    let html = document(&results, &["hps-micro"], |n| n == "hps-micro").html();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    assert!(html.contains("<figure class=\"plot\"><svg xmlns=\"http://www.w3.org/2000/svg\""), "{html}");
    assert!(!html.contains("<?xml"), "the prolog is dropped inside HTML");
    assert!(html.contains("is missing"), "the full run's plot file is absent and named");
    assert!(html.contains("<h2 id=\"hps-micro\">") && html.contains("href=\"#hps-micro\""), "anchors work");
    assert!(html.contains("<table>") && html.contains("<td>1.000</td>"), "{html}");
    // Nothing to fetch: no scripts, no external style sheets or images.
    assert!(!html.contains("<script") && !html.contains("<link") && !html.contains("src="));
}

/// A rendering keeps what it showed; a later one on a machine that ran only some experiments
/// takes the rest from there, and a result run since wins over the kept one.
#[test]
fn results_not_run_again_come_from_the_archive_beside_the_document() {
    let dir = std::env::temp_dir().join(format!("pw-figures-archive-{}", std::process::id()));
    let archive = archive_beside(&dir.join("docs/FIGURES.md"));
    assert_eq!(archive, dir.join("docs/results"));
    let mut with_data = result("hps-micro", "full", json!({"a": 2.0}));
    with_data["data"] = json!({"raw": [1, 2, 3]});
    with_data["kept_as"] = json!("rebuilt from an older document");
    let first = Results::from_values(
        &dir,
        [result("hps-micro", "quick", json!({"a": 1.0})), with_data, result("dlm-fault", "quick", json!({"b": 3.0}))],
    );
    first.keep(&archive).unwrap();
    let kept: Value =
        serde_json::from_str(&std::fs::read_to_string(archive.join("hps-micro-full.json")).unwrap()).unwrap();
    assert!(kept.get("data").is_none(), "raw data is not kept: {kept}");
    assert_eq!(kept["summary"]["a"], json!(2.0));

    // A new machine ran hps-micro quick again, nothing else.
    let mut later = Results::from_values(&dir, [result("hps-micro", "quick", json!({"a": 9.0}))]);
    let names = ["hps-micro", "dlm-fault", "reclaim-split"];
    assert_eq!(later.fill_from(&archive, &names).unwrap(), 2, "hps-micro full and dlm-fault quick");
    let md = document(&later, &names, |n| names.contains(&n)).markdown();
    assert!(md.contains("| `a` | 9.000 | 2.000 |"), "the new quick run, the kept full run:\n{md}");
    assert!(md.contains("| `b` | 3.000 | not run |"), "{md}");
    assert!(md.contains("abc1234 checked out, Linux 6.18.0, 12 s (rebuilt from an older document)."), "{md}");

    // A file filed under the wrong mode is refused, not shown as the other.
    std::fs::write(archive.join("reclaim-split-full.json"), result("reclaim-split", "quick", json!({})).to_string())
        .unwrap();
    let err = Results::from_values(&dir, []).fill_from(&archive, &names).unwrap_err();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(err.to_string().contains("reclaim-split-full.json: not a full result"), "{err}");
}

#[test]
fn slugs_match_githubs_anchors() {
    assert_eq!(slug("`hps-micro`"), "hps-micro");
    assert_eq!(slug("Where the figures come from"), "where-the-figures-come-from");
    assert_eq!(slug("DLM: memory of other hosts"), "dlm-memory-of-other-hosts");
}
