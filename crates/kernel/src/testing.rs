//! Test support: a test that cannot run for lack of a kernel feature says so with [`skip`],
//! and the skip is counted as a skip, not as a pass.
//!
//! `make test` sets `PAGEWISE_SKIP_LOG` to a file (`target/skips.log`, emptied at the start of
//! the run); [`skip`] appends one line per skipped test there, `TEST_BINARY::TEST_PATH: REASON`,
//! and the Makefile counts those lines out of `passed` and lists them before its closing line.
//! Without the variable (a plain `cargo test`) the skip is only printed.
//!
//! Usage, at the point where the test finds the feature missing:
//! ```no_run
//! # let uffd_missing = true;
//! if uffd_missing {
//!     return pagewise_kernel::testing::skip("userfaultfd unavailable");
//! }
//! ```

use std::fmt::Display;
use std::io::Write;

/// The environment variable naming the skip log.
pub const SKIP_LOG_ENV: &str = "PAGEWISE_SKIP_LOG";

/// Record that the calling test is skipped because of `reason`, print it, and return (the
/// caller returns right after). The test name is the name libtest gives the thread running
/// each test (its module path), prefixed with the test binary's name.
///
/// Panics when the log named by `PAGEWISE_SKIP_LOG` cannot be written: a skip that is not
/// counted would be reported as a pass, which is what this helper exists to prevent.
pub fn skip(reason: impl Display) {
    let line = skip_line(&test_name(), &reason.to_string());
    eprintln!("skipped: {}", line.trim_end());
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|p| !p.is_empty()) {
        let path = std::path::PathBuf::from(path);
        if let Err(e) = append_line(&path, &line) {
            panic!("cannot append to the skip log {}: {e}", path.display());
        }
    }
}

/// Run `sh -c script` as user and group `uid`, as another user of the host would (tests that
/// plant files where Pagewise must not follow them). Returns false, after [`skip`], when this
/// process cannot switch users (it is not root); panics when the script fails.
pub fn run_as_user(uid: u32, script: &str) -> bool {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("acting as another user needs root");
        return false;
    }
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(uid)
        .gid(uid)
        .output()
        .expect("running sh as another user");
    assert!(out.status.success(), "`{script}` as uid {uid}: {}", String::from_utf8_lossy(&out.stderr));
    true
}

/// Append `line` to `path` with O_APPEND and one write(2): lines from test binaries and test
/// threads running at the same time never interleave (write(2): with O_APPEND "the file offset
/// is first set to the end of the file before writing. The adjustment of the file offset and
/// the write operation are performed as an atomic step").
fn append_line(path: &std::path::Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    let n = file.write(line.as_bytes())?;
    if n != line.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, format!("short write: {n} of {}", line.len())));
    }
    Ok(())
}

/// `BINARY::TEST`: the test binary's name without cargo's hash suffix, and the thread name.
fn test_name() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|n| strip_hash(&n).to_string())
        .unwrap_or_else(|| "unknown".into());
    let thread = std::thread::current().name().map(str::to_string).unwrap_or_else(|| "unnamed thread".into());
    format!("{binary}::{thread}")
}

/// `guard_restores-0123456789abcdef` -> `guard_restores`.
fn strip_hash(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => stem,
        _ => name,
    }
}

/// One log line: the name, the reason on one line, a newline.
fn skip_line(name: &str, reason: &str) -> String {
    let reason: String = reason.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }).collect();
    format!("{name}: {reason}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_line_whatever_the_reason() {
        assert_eq!(skip_line("kernel::t", "no\nuffd\r"), "kernel::t: no uffd \n");
        assert_eq!(skip_line("a::b", "x").matches('\n').count(), 1);
    }

    #[test]
    fn cargo_hash_suffixes_are_stripped_and_other_names_kept() {
        assert_eq!(strip_hash("guard_restores-0123456789abcdef"), "guard_restores");
        assert_eq!(strip_hash("pagewise_kernel-89ab0123cdef4567"), "pagewise_kernel");
        assert_eq!(strip_hash("pagewise-reclaim-load"), "pagewise-reclaim-load");
        assert_eq!(strip_hash("plain"), "plain");
    }

    #[test]
    fn lines_appended_by_concurrent_threads_stay_whole() {
        let scratch = crate::private_dir::PrivateDir::new("skiplog-test").unwrap();
        let path = scratch.join("skips");
        let _ = std::fs::remove_file(&path);
        std::thread::scope(|s| {
            for t in 0..8 {
                let path = &path;
                s.spawn(move || {
                    for i in 0..200 {
                        append_line(
                            path,
                            &skip_line(&format!("bin::t{t}"), &format!("reason {i} {}", "x".repeat(100))),
                        )
                        .unwrap();
                    }
                });
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1600);
        for l in lines {
            let (name, reason) = l.split_once(": ").unwrap();
            assert!(
                name.starts_with("bin::t") && reason.starts_with("reason ") && reason.ends_with(&"x".repeat(100)),
                "{l}"
            );
        }
    }

    #[test]
    fn the_test_name_is_the_thread_libtest_runs_the_test_on() {
        let name = test_name();
        assert!(name.ends_with("::testing::tests::the_test_name_is_the_thread_libtest_runs_the_test_on"), "{name}");
    }
}
