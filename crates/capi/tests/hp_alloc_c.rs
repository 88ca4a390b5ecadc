//! Compile tests/hp_alloc_test.c with `cc` against libpagewise.a through include/pagewise.h
//! and run it: the hp_alloc C ABI as a C program sees it.

use std::path::PathBuf;
use std::process::Command;

fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf()
}

#[test]
fn c_program_uses_the_hp_alloc_api() {
    let dir = target_dir();
    let lib = dir.join("libpagewise.a");
    assert!(lib.exists(), "{} missing", lib.display());
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let exe = dir.join("hp_alloc_c_test");
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-I"])
        .arg(manifest.join("../../include"))
        .arg(manifest.join("tests/hp_alloc_test.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(&exe).env("PAGEWISE_HP_SEGMENT_MB", "32").output().unwrap();
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && so.contains("C-HP-ALLOC-OK"), "{so}\n{}", String::from_utf8_lossy(&out.stderr));
}
