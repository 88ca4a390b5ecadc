//! Builds the LD_PRELOAD shim (`preload/*.c`, C) into a shared object that `pagewise run`
//! carries inside the binary (`run.rs` writes it out next to the program it starts). Symbols
//! are hidden but for the calls the shim interposes (marked `PW_EXPORT`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../preload");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("libpagewise_preload.so");
    let sources = ["shim.c", "vm.c", "bss.c", "ranges.c", "arena_dlm.c", "arena_hps.c"];
    for f in sources.iter().chain(["arena.h", "shim.h", "ranges.h"].iter()) {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
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
}
