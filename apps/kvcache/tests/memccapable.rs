//! libmemcached's conformance checker, `memccapable -a` (the ASCII protocol tests), against the
//! real server process: every test must pass. It is a third-party client's view of the protocol
//! (it found `verbosity noreply` answered with an error that memcached 1.6 keeps silent).

mod common;

use std::process::Command;

use common::Server;

#[test]
fn memccapable_ascii_passes_every_test() {
    memccapable(|| Server::start(&["-m", "16", "-t", "2"]));
}

/// The same against a server confined to one CPU, whose idle workers poll before they sleep.
#[test]
fn memccapable_ascii_passes_every_test_on_a_polling_server() {
    memccapable(|| Server::start_confined(&["-m", "16", "-t", "2"]));
}

fn memccapable(start: impl FnOnce() -> Server) {
    let Some(bin) = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join("memccapable")).find(|p| p.exists()))
    else {
        pagewise_kernel::testing::skip("memccapable not installed (libmemcached-tools; `make deps`)");
        return;
    };
    let srv = start();
    let (host, port) = srv.addr.rsplit_once(':').expect("host:port");
    let out =
        Command::new(&bin).args(["-h", host, "-p", port, "-a", "-v", "-t", "5"]).output().expect("run memccapable");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let passed = text.matches("[pass]").count();
    let failed = text.matches("[FAIL]").count();
    assert!(out.status.success() && failed == 0 && text.contains("All tests passed"), "memccapable -a:\n{text}");
    // libmemcached 1.1's ASCII suite has 27 tests; fewer passes would mean some did not run.
    assert!(passed >= 27, "{passed} tests passed, expected 27:\n{text}");
}
