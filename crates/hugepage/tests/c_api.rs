//! The C API from a C program: compiled with `cc` against include/pagewise.h and linked with
//! the static libpagewise.a.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn c_program_uses_the_hps_api() {
    if pagewise_kernel::uffd::UffdBuilder::new().require(pagewise_kernel::uffd::feature::MINOR_SHMEM).open().is_err() {
        pagewise_kernel::testing::skip("userfaultfd MINOR_SHMEM unavailable");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // `cargo test` does not build the staticlib of another package; build it (a no-op when
    // `make test` already did).
    let st = Command::new(&cargo)
        .args(["build", "--release", "-p", "pagewise-capi"])
        .current_dir(&root)
        .status()
        .expect("running cargo");
    assert!(st.success(), "building libpagewise.a failed");
    let target = std::env::var("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|_| root.join("target"));
    let lib = target.join("release/libpagewise.a");
    let run = build_and_run(&root, &lib, &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/c/hps_test.c"), "test");
    // The README's example builds and runs too.
    let ex_run = build_and_run(&root, &lib, &root.join("examples/c/hps_example.c"), "example");
    assert!(ex_run.status.success() && String::from_utf8_lossy(&ex_run.stdout).contains("promoted "));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("OK"),
        "C test failed: {stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Compile `src` with cc against include/ and `lib`, run it, remove the binary.
fn build_and_run(
    root: &std::path::Path,
    lib: &std::path::Path,
    src: &std::path::Path,
    what: &str,
) -> std::process::Output {
    let scratch = pagewise_kernel::private_dir::PrivateDir::new(&format!("hps-c-{what}")).unwrap();
    let out = scratch.join("program");
    let cc = Command::new("cc")
        .args(["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", "-O1", "-I"])
        .arg(root.join("include"))
        .arg(src)
        .arg(lib)
        .args(["-lpthread", "-ldl", "-lm", "-lgcc_s", "-o"])
        .arg(&out)
        .output()
        .expect("running cc");
    assert!(cc.status.success(), "cc failed on the {what}:\n{}", String::from_utf8_lossy(&cc.stderr));
    let run = Command::new(&out).output().unwrap_or_else(|e| panic!("running the C {what}: {e}"));
    let _ = std::fs::remove_file(&out);
    run
}
