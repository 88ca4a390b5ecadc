//! Builds the LD_PRELOAD shim (`preload/*.c`, C) into a shared object that `pagewise run`
//! carries inside the binary (`run.rs` writes it out next to the program it starts; symbols
//! are hidden but for the calls the shim interposes, marked `PW_EXPORT`), and the PMIx
//! exchange of `pagewise mpi` (`pmix/pmix_exchange.c`, against libpmix-dev) into one that
//! `mpi.rs` loads at run time, so the binary itself does not need libpmix.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../preload");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("libpagewise_preload.so");
    let sources = ["shim.c", "vm.c", "bss.c", "ranges.c", "fork.c", "fds.c", "others.c", "arena_dlm.c", "arena_hps.c"];
    for f in sources.iter().chain(["arena.h", "shim.h", "ranges.h"].iter()) {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("../include/pagewise/dlm.h").display());
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-fvisibility=hidden", "-o"])
        .arg(&out)
        .args(sources.iter().map(|s| root.join(s)))
        .args(["-ldl", "-lpthread"])
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?} for preload/ failed: {e} (install build-essential)"));
    assert!(status.success(), "compiling the preload shim (preload/*.c) with {cc} failed");
    build_pmix_exchange(&cc);
}

fn build_pmix_exchange(cc: &str) {
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("pmix/pmix_exchange.c");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("libpagewise_pmix.so");
    println!("cargo:rerun-if-changed={}", src.display());
    let flags = Command::new("pkg-config").args(["--cflags", "--libs", "pmix"]).output();
    let flags = match flags {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).expect("pkg-config prints text"),
        _ => panic!(
            "pkg-config finds no PMIx (pmix.pc): install libpmix-dev (Debian; `make deps` installs it with \
             libopenmpi-dev), which `pagewise mpi` is built against"
        ),
    };
    let status = Command::new(cc)
        .args(["-O2", "-g", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o"])
        .arg(&out)
        .arg(&src)
        .args(flags.split_whitespace())
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc:?} for pmix/ failed: {e}"));
    assert!(status.success(), "compiling the PMIx exchange (pmix/pmix_exchange.c) with {cc} failed");
}
