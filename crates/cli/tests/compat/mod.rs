//! What the compatibility tests share (compat_dlm.rs, compat_hps.rs): a third-party program
//! (pagewise_eval::programs) run plain and under a Pagewise wrapper must give the same
//! canonical output, and the wrapper must really have put its memory on Pagewise.

use std::path::PathBuf;
use std::time::Duration;

use pagewise_eval::programs::{routed_allocations, run, Job, Outcome, Scratch, Wrap};

pub fn pagewise() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pagewise"))
}

/// libpagewise.so must sit next to the binary (`make build` builds the workspace).
pub fn ensure_libpagewise() {
    static BUILD: std::sync::Once = std::sync::Once::new();
    BUILD.call_once(|| {
        let lib = pagewise().parent().unwrap().join("libpagewise.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st =
                std::process::Command::new(cargo).args(["build", "--release", "-p", "pagewise-capi"]).status().unwrap();
            assert!(st.success(), "building libpagewise.so failed");
        }
    });
}

/// Whether `program` runs here (`--version`-like probe); the tests need Debian's packages
/// (make deps installs them), and their absence is a skip with the reason.
pub fn installed(program: &str, probe: &[&str]) -> bool {
    let ok = std::process::Command::new(program).args(probe).output().is_ok_and(|o| o.status.success());
    if !ok {
        pagewise_kernel::testing::skip(format!("{program} is not installed (make deps)"));
    }
    ok
}

/// A budget no correct run comes near (plain runs take about a second): a run that needs it
/// hangs or thrashes, and fails.
pub const BUDGET: Duration = Duration::from_secs(60);

/// Run `job` plain, then under `wrap`; both must finish, the outputs be the same, and the shim
/// must report routed allocations on `arena`. Returns (plain, wrapped) outcomes.
pub fn same_output(job: &Job, wrap: &Wrap, arena: &str) -> (Outcome, Outcome) {
    ensure_libpagewise();
    job.reset().unwrap();
    let plain = run(job.command(&pagewise(), &Wrap::Plain), BUDGET, None).unwrap();
    let want = job.canonical(&plain).unwrap_or_else(|e| panic!("{} on its own: {e:#}", job.name));
    job.reset().unwrap();
    let wrapped = run(job.command(&pagewise(), wrap), BUDGET, None).unwrap();
    let what = format!("{} under {wrap:?}", job.name);
    assert!(
        wrapped.finished(),
        "{what}: did not finish within {BUDGET:?} (plain: {:.1} s)\n{}",
        plain.wall,
        tail(&wrapped.stderr)
    );
    let got = job.canonical(&wrapped).unwrap_or_else(|e| panic!("{what}: {e:#}\n{}", tail(&wrapped.stderr)));
    assert_eq!(got, want, "{what}: the output differs from the plain run's\n{}", tail(&wrapped.stderr));
    let routed = routed_allocations(&wrapped.stderr, arena)
        .unwrap_or_else(|| panic!("{what}: no routing report on stderr\n{}", tail(&wrapped.stderr)));
    assert!(routed >= 1, "{what}: nothing ran on {arena} memory\n{}", tail(&wrapped.stderr));
    (plain, wrapped)
}

pub fn tail(text: &str) -> String {
    pagewise_eval::programs::tail(text, 30)
}

pub fn scratch(tag: &str) -> Scratch {
    Scratch::new(&format!("compat-{tag}")).unwrap()
}
