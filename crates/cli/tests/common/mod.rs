//! What the tests that run unmodified C programs under the preload shim share: the `pagewise`
//! binary, libpagewise.so next to it, and the test programs in tests/run/ compiled into a
//! scratch directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

pub fn pagewise() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pagewise"))
}

/// libpagewise.so must sit next to the binary (`make build` builds the workspace; a lone
/// `cargo test -p pagewise-cli` may not have).
pub fn ensure_libpagewise() {
    static BUILD: Once = Once::new();
    BUILD.call_once(|| {
        let lib = pagewise().parent().unwrap().join("libpagewise.so");
        if !lib.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = Command::new(cargo).args(["build", "--release", "-p", "pagewise-capi"]).status().unwrap();
            assert!(st.success(), "building libpagewise.so failed");
        }
    });
}

/// Compile tests/run/NAME.c into `dir`, linked with a shared library of its own when there is
/// a tests/run/NAME_lib.c: a library the program links runs its constructors before the
/// preloaded shim's, as an allocator's do.
pub fn compile(name: &str, dir: &Path) -> PathBuf {
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/run");
    let src = sources.join(format!("{name}.c"));
    let out = dir.join(name);
    let mut cc = Command::new("cc");
    cc.args(["-O2", "-pthread", "-o"]).arg(&out).arg(&src);
    let lib_src = sources.join(format!("{name}_lib.c"));
    if lib_src.is_file() {
        let lib = dir.join(format!("lib{name}.so"));
        let st = Command::new("cc")
            .args(["-O2", "-pthread", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(&lib_src)
            .status()
            .expect("cc");
        assert!(st.success(), "compiling {}", lib_src.display());
        cc.arg("-L").arg(dir).arg(format!("-l{name}")).arg(format!("-Wl,-rpath,{}", dir.display()));
    }
    let st = cc.status().expect("cc");
    assert!(st.success(), "compiling {}", src.display());
    out
}

/// A private scratch directory of this test (mkdtemp), removed when dropped.
pub fn tempdir(tag: &str) -> pagewise_kernel::private_dir::PrivateDir {
    pagewise_kernel::private_dir::PrivateDir::new(&format!("run-test-{tag}")).unwrap()
}
