//! `pagewise eval report`: the figures document from a results directory, as Markdown on
//! stdout or in a file, and as one HTML page with the plots inline.

use std::process::Command;

fn pagewise(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagewise")).args(args).output().expect("run pagewise")
}

#[test]
fn report_writes_the_figures_document_and_the_html_page() {
    let dir = std::env::temp_dir().join(format!("pw-eval-report-{}", std::process::id()));
    let quick = dir.join("results/dlm-autotune");
    std::fs::create_dir_all(&quick).unwrap();
    let result = serde_json::json!({
        "name": "dlm-autotune", "description": "auto vs fixed", "mode": "quick", "duration_s": 139.0,
        "finished_at": "2026-11-23 21:42 UTC", "machine": {"kernel": "6.18", "commit": "c91e5e5"},
        "summary": {"auto_vs_best_fixed_max": 1.049, "auto_vs_best_fixed_max_censored": "lower_bound"},
        "tables": [], "plots": [{"title": "t", "x_label": "x", "y_label": "y", "log_x": false, "series": []}],
        "notes": [],
    });
    std::fs::write(quick.join("result.json"), result.to_string()).unwrap();
    std::fs::write(quick.join("plot.svg"), "<svg xmlns=\"http://www.w3.org/2000/svg\"><rect/></svg>").unwrap();
    let results = dir.join("results");
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    let (md, html) = (dir.join("docs/FIGURES.md"), dir.join("page.html"));
    let out = pagewise(&["eval", "report", "--out", results.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(printed.starts_with("# Figures") && printed.contains("≥ 1.049"), "{printed}");
    let out = pagewise(&[
        "eval",
        "report",
        "--out",
        results.to_str().unwrap(),
        "--figures",
        md.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&md).unwrap(), printed, "the file holds what report prints");
    // What it showed is kept beside it (docs/results/), without the raw data.
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("docs/results/dlm-autotune.json")).unwrap()).unwrap();
    assert_eq!(kept["summary"], result["summary"]);
    // Rendered again with the results gone (another machine), the document is the same.
    std::fs::remove_dir_all(&quick).unwrap();
    let out = pagewise(&["eval", "report", "--out", results.to_str().unwrap(), "--figures", md.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&md).unwrap(), printed, "taken from docs/results/");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg xmlns") && page.contains("<h2 id=\"headlines\">"), "{page}");
    // --html alone: next to the results.
    let out = pagewise(&["eval", "report", "--out", results.to_str().unwrap(), "--html"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(results.join("report.html").is_file());
    // Only with report.
    let out = pagewise(&["eval", "thp-baseline", "--html"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("go with `pagewise eval report`"));
    std::fs::remove_dir_all(&dir).unwrap();
}
