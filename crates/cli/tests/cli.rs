//! The `pagewise` binary end to end: doctor's report agrees with what the kernel's files say,
//! and eval rejects bad input clearly.

use std::path::Path;
use std::process::Command;

fn pagewise(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagewise")).args(args).output().expect("run pagewise")
}

fn doctor_json() -> serde_json::Value {
    let out = pagewise(&["doctor", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON")
}

fn status(j: &serde_json::Value, key: &str) -> String {
    j[key]["status"].as_str().unwrap_or_else(|| panic!("no status for {key}")).to_string()
}

#[test]
fn doctor_agrees_with_the_kernel_files() {
    let j = doctor_json();
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    if let (Some(a), Some(b)) = (thp.find('['), thp.find(']')) {
        assert_eq!(j["thp_enabled"]["value"], &thp[a + 1..b]);
    }
    let idle = Path::new("/sys/kernel/mm/page_idle/bitmap").exists();
    assert_eq!(status(&j, "page_idle") == "absent", !idle);
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    assert_eq!(status(&j, "swap") == "absent", swaps.lines().count() <= 1);
    let mut sizes: Vec<u64> = std::fs::read_dir("/sys/kernel/mm/hugepages")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok())
        .collect();
    sizes.sort();
    let reported: Vec<u64> =
        j["hugetlb_sizes_kb"]["value"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(reported, sizes);
    let psi = Path::new("/proc/pressure/memory").exists();
    assert_eq!(status(&j, "psi") == "present", psi);
    for key in [
        "madv_collapse",
        "userfaultfd",
        "damon_vaddr",
        "pagemap_scan",
        "cgroup_v1_memory",
        "cgroup_v2_memory",
        "tracefs_vmscan",
    ] {
        assert!(["present", "absent", "unusable"].contains(&status(&j, key).as_str()), "{key}");
    }
}

#[test]
fn doctor_changes_nothing() {
    let read = || {
        (
            std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok(),
            std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages").ok(),
            Path::new("/sys/kernel/tracing/events").exists(),
            std::fs::read_to_string("/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds").ok(),
        )
    };
    let before = read();
    let _ = doctor_json();
    assert_eq!(read(), before);
}

#[test]
fn doctor_table_names_every_feature() {
    let out = pagewise(&["doctor"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for key in ["thp_enabled", "userfaultfd", "tracefs_vmscan", "swap"] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
}

#[test]
fn eval_lists_and_rejects_unknown_names() {
    let out = pagewise(&["eval", "list"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("thp-baseline"));
    let out = pagewise(&["eval", "no-such-experiment"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no experiment named") && err.contains("thp-baseline"), "{err}");
    let out = pagewise(&["eval", "thp-baseline", "--quick", "--full"]);
    assert!(!out.status.success(), "--quick and --full conflict");
}

/// Every name in doctor's "used by" exists in this build: a `pagewise ...` command answers
/// `--help` (an experiment is in `eval list`), a C API name is declared in the installed header.
#[test]
fn doctor_names_only_features_that_exist() {
    let j = doctor_json();
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../include/pagewise.h")).unwrap();
    let header_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../include/pagewise");
    let mut headers = header.clone();
    for e in std::fs::read_dir(header_dir).unwrap() {
        headers.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap());
    }
    let experiments = String::from_utf8(pagewise(&["eval", "list"]).stdout).unwrap();
    let mut names = std::collections::BTreeSet::new();
    for (key, v) in j.as_object().unwrap() {
        let Some(used_by) = v.get("used_by") else { continue };
        for n in used_by.as_array().unwrap_or_else(|| panic!("{key}: used_by is not a list")) {
            names.insert(n.as_str().unwrap().to_string());
        }
    }
    assert!(names.len() >= 5, "too few features registered: {names:?}");
    for name in &names {
        if let Some(rest) = name.strip_prefix("pagewise eval ") {
            assert!(
                experiments.lines().any(|l| l.split_whitespace().next() == Some(rest)),
                "{name}: no such experiment"
            );
        } else if name.starts_with("pagewise-") {
            // Another program of this workspace, built next to `pagewise`.
            let program = name.split_whitespace().next().unwrap();
            let path = std::path::Path::new(env!("CARGO_BIN_EXE_pagewise")).with_file_name(program);
            let out = Command::new(&path).arg("--help").output();
            assert!(out.is_ok_and(|o| o.status.success()), "{name}: {} does not run", path.display());
        } else if let Some(rest) = name.strip_prefix("pagewise ") {
            let words: Vec<&str> = rest.split(" (").next().unwrap().split_whitespace().collect();
            let mut args = words.clone();
            args.push("--help");
            let out = pagewise(&args);
            assert!(out.status.success(), "{name}: `pagewise {}` is not a command", words.join(" "));
        } else {
            // A C API: its prefix or function name is declared in the headers.
            let ident: String = name
                .split([' ', '*', ':'])
                .next()
                .unwrap()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            assert!(!ident.is_empty() && headers.contains(&ident), "{name}: {ident} is not in include/pagewise*.h");
        }
    }
}
