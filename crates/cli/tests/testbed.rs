//! `pagewise testbed`: a detached holder keeps the testbed up; `exec` enters a host with its
//! host name; `status` shows the shaped links; `down` removes everything, also after the
//! holder was killed with SIGKILL (its journal is replayed). Needs root and iproute2.

use pagewise_kernel::netns;
use pagewise_kernel::testbed::TestbedState;
use std::path::PathBuf;
use std::process::{Command, Output};

fn pagewise() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_pagewise"))
}

fn testbed(args: &[&str]) -> Output {
    Command::new(pagewise()).arg("testbed").args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{:?}: {text}", out.status);
    text
}

fn name(tag: char) -> String {
    format!("{tag}{}", std::process::id() % 10_000_000)
}

#[test]
fn up_exec_status_and_down() {
    let n = name('c');
    let up = ok(&testbed(&["up", "--name", &n, "--hosts", "2", "--net", "10gbe"]));
    assert!(up.contains("ready") && up.contains(&format!("{n}-h1 10.77.0.2")), "{up}");

    let st = ok(&testbed(&["status", "--name", &n]));
    assert!(st.contains("10gbe") && st.contains("rate 10Gbit"), "{st}");

    // ssh-like: the words are one shell command line, run on the host with its host name.
    let out = ok(&testbed(&[
        "exec",
        &format!("{n}-h1"),
        "--",
        "hostname;",
        "cat",
        "/proc/net/dev",
        "|",
        "grep",
        "-c",
        "eth0",
    ]));
    assert_eq!(out, format!("{n}-h1\n1\n"));

    let e = testbed(&["exec", "not-a-testbed-host", "--", "true"]);
    assert!(!e.status.success() && String::from_utf8_lossy(&e.stderr).contains("no testbed"));
    let e = testbed(&["up", "--name", &n, "--hosts", "2"]);
    assert!(!e.status.success() && String::from_utf8_lossy(&e.stderr).contains("up already"), "{e:?}");
    let e = testbed(&["up", "--name", &name('x'), "--subnet", "8.8.8"]);
    assert!(!e.status.success() && String::from_utf8_lossy(&e.stderr).contains("not private"), "{e:?}");

    ok(&testbed(&["down", "--name", &n]));
    assert!(!netns::exists(&format!("{n}-h0")) && !netns::exists(&format!("{n}-sw")));
    assert!(TestbedState::load(&n).unwrap().is_none());
}

#[test]
fn down_after_the_holder_was_killed_replays_its_journal() {
    let n = name('j');
    ok(&testbed(&["up", "--name", &n, "--hosts", "2", "--net", "100gbe"]));
    let holder = TestbedState::load(&n).unwrap().unwrap().holder_pid;
    pagewise_kernel::net::kill(holder as i32, libc::SIGKILL).unwrap();
    while pagewise_kernel::net::kill(holder as i32, 0).is_ok() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // A SIGKILL cannot clean up: its journal is replayed by `down`, or already by the next
    // settings guard made on the machine (another test's, another run's).
    let st = ok(&testbed(&["status", "--name", &n]));
    assert!(st.contains("holder gone") || st.contains("no testbed is up"), "{st}");
    ok(&testbed(&["down", "--name", &n]));
    assert!(
        !netns::exists(&format!("{n}-h0")) && !netns::exists(&format!("{n}-h1")) && !netns::exists(&format!("{n}-sw"))
    );
    assert!(TestbedState::load(&n).unwrap().is_none());
}

#[test]
fn profiles_are_listed_with_their_sources() {
    let out = ok(&testbed(&["profiles"]));
    for p in ["myrinet-10g-x2", "25gbe", "100gbe", "unshaped", "802.3by"] {
        assert!(out.contains(p), "{out}");
    }
}
