//! Redundancy (issue 24 item 3): a memory server SIGKILLed at a random point of a run loses
//! nothing. Each scenario runs in a child process against real `pagewise dlm-server`s: random
//! writes, reads, discards, unit-size changes and evictions of a DLM area, mirrored in plain
//! memory; the child kills a server itself at a point its seed picks (often with read-ahead in
//! flight), and every byte is checked against the mirror on every read and at the end. A
//! second failure before the lost pieces are rebuilt stops the program with a message, never
//! with wrong data; after the rebuild it is survived.

mod common;

use common::{in_child, run_child, ServerProc};
use pagewise_dlm::{Config, Dlm, FaultMode, Redundancy};

const PAGE: usize = 4096;
const LEN: usize = 6 << 20;

/// xorshift64*: the scenario's only source of choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} not set"))
}

fn kill(pid: i32) {
    // SAFETY: signalling a server process the parent started for this scenario.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// Compare pages `[p0, p1)` of the area with the mirror; panics naming the first wrong byte.
fn check(base: *mut u8, mirror: &[u8], p0: usize, p1: usize, when: &str) {
    for p in p0..p1 {
        // SAFETY: inside the area, ordinary memory to this process.
        let got = unsafe { std::slice::from_raw_parts(base.add(p * PAGE), PAGE) };
        let want = &mirror[p * PAGE..(p + 1) * PAGE];
        if got != want {
            let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
            println!("WRONG page {p} byte {i}: {:#x} instead of {:#x} ({when})", got[i], want[i]);
            std::process::exit(3);
        }
    }
}

/// The child: a random run over the servers in `DLM_TEST_SERVERS`, killing the servers in
/// `DLM_TEST_VICTIMS` at op `DLM_TEST_KILL_AT` (one after the other, `DLM_TEST_GAP` ops apart).
fn scenario() {
    let servers: Vec<String> = env("DLM_TEST_SERVERS").split(',').map(String::from).collect();
    let victims: Vec<i32> =
        env("DLM_TEST_VICTIMS").split(',').filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let seed: u64 = env("DLM_TEST_SEED").parse().unwrap();
    let kill_at: usize = env("DLM_TEST_KILL_AT").parse().unwrap();
    let gap: usize = env("DLM_TEST_GAP").parse().unwrap();
    let mode = FaultMode::parse(&env("DLM_TEST_MODE")).unwrap();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let cfg = Config {
        servers,
        local_mem: 1 << 20,
        base_page: PAGE,
        max_set: 16,
        set_count: 1 << rng.below(5),
        fault_mode: mode,
        readahead: [0, 4, 16][rng.below(3)],
        fault_timeout: Some(std::time::Duration::from_secs(10)),
        redundancy: Redundancy::parse(&env("DLM_TEST_REDUNDANCY")).unwrap(),
        ..Config::default()
    };
    let dlm = Dlm::init(cfg).unwrap();
    let base = dlm.alloc(LEN).unwrap();
    let pages = LEN / PAGE;
    let mut mirror = vec![0u8; LEN];
    let ops: usize = env("DLM_TEST_OPS").parse().unwrap();
    let mut next_victim = 0;
    for op in 0..ops {
        if next_victim < victims.len() && op == kill_at + next_victim * gap {
            kill(victims[next_victim]);
            next_victim += 1;
        }
        let p0 = rng.below(pages);
        let n = (1 + rng.below(48)).min(pages - p0);
        match rng.below(12) {
            0..=3 => {
                for p in p0..p0 + n {
                    let v = rng.next();
                    let stamp = v.to_le_bytes();
                    let at = (v as usize >> 8) % (PAGE - 8);
                    // SAFETY: inside the area.
                    unsafe {
                        std::ptr::write_bytes(base.add(p * PAGE), v as u8, PAGE);
                        std::ptr::copy_nonoverlapping(stamp.as_ptr(), base.add(p * PAGE + at), 8);
                    }
                    mirror[p * PAGE..(p + 1) * PAGE].fill(v as u8);
                    mirror[p * PAGE + at..p * PAGE + at + 8].copy_from_slice(&stamp);
                }
            }
            4..=7 => check(base, &mirror, p0, p0 + n, "a read"),
            8 => {
                // A whole sequential pass now and then: read-ahead in flight.
                let from = rng.below(pages / 2);
                check(base, &mirror, from, (from + pages / 4).min(pages), "a sequential pass");
            }
            9 => dlm.set_count(1 << rng.below(5)).unwrap(),
            10 => {
                dlm.evict_all();
            }
            _ => {
                dlm.discard(base as usize + p0 * PAGE, n * PAGE).unwrap();
                mirror[p0 * PAGE..(p0 + n) * PAGE].fill(0);
            }
        }
    }
    assert_eq!(next_victim, victims.len(), "every victim killed");
    check(base, &mirror, 0, pages, "the final check");
    dlm.evict_all();
    check(base, &mirror, 0, pages, "the final check after eviction");
    println!("FAILOVER-OK");
}

/// One child run: `n` servers, `scheme` in fault mode `mode`, the servers at `victims`
/// (indices) killed from op `kill_at`, `gap` ops apart, `ops` ops in all.
struct Plan<'a> {
    n: usize,
    scheme: &'a str,
    mode: &'a str,
    seed: u64,
    victims: &'a [usize],
    kill_at: usize,
    gap: usize,
    ops: usize,
}

/// Start the plan's servers and run the scenario in a child; the child's output.
fn run_one(test: &str, p: &Plan) -> std::process::Output {
    let servers: Vec<ServerProc> = (0..p.n).map(|_| ServerProc::start("1G")).collect();
    let addrs: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    let pids: Vec<String> = p.victims.iter().map(|&v| servers[v].child.id().to_string()).collect();
    run_child(
        test,
        &[
            ("DLM_TEST_SERVERS", addrs.join(",")),
            ("DLM_TEST_VICTIMS", pids.join(",")),
            ("DLM_TEST_SEED", p.seed.to_string()),
            ("DLM_TEST_KILL_AT", p.kill_at.to_string()),
            ("DLM_TEST_GAP", p.gap.to_string()),
            ("DLM_TEST_OPS", p.ops.to_string()),
            ("DLM_TEST_MODE", p.mode.to_string()),
            ("DLM_TEST_REDUNDANCY", p.scheme.to_string()),
        ],
    )
}

/// Seeds `seeds` of `scheme` over `n` servers in `mode`, one server killed at a random op:
/// every run ends with every byte right.
fn survives_one_loss(test: &str, scheme: &str, n: usize, mode: &str, seeds: std::ops::Range<u64>) {
    if in_child() {
        scenario();
        return;
    }
    for seed in seeds {
        let mut rng = Rng(seed ^ 0x5151);
        let victim = rng.below(n);
        let kill_at = rng.below(150);
        let out = run_one(test, &Plan { n, scheme, mode, seed, victims: &[victim], kill_at, gap: 0, ops: 200 });
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("FAILOVER-OK"),
            "{scheme} {mode} seed {seed}: server {victim} killed at op {kill_at}:\n{stdout}\n{stderr}"
        );
        assert!(stderr.contains("lost"), "the loss is reported: {stderr}");
    }
}

#[test]
fn erasure_coded_run_survives_a_killed_server_handler_thread() {
    survives_one_loss("erasure_coded_run_survives_a_killed_server_handler_thread", "ec:2+1", 4, "thread", 0..6);
}

#[test]
fn erasure_coded_run_survives_a_killed_server_sigbus() {
    survives_one_loss("erasure_coded_run_survives_a_killed_server_sigbus", "ec:2+1", 4, "sigbus", 100..106);
}

#[test]
fn erasure_coded_run_with_no_spare_server_survives_a_killed_server() {
    survives_one_loss(
        "erasure_coded_run_with_no_spare_server_survives_a_killed_server",
        "ec:2+1",
        3,
        "sigbus",
        200..204,
    );
}

#[test]
fn wider_code_survives_a_killed_server() {
    survives_one_loss("wider_code_survives_a_killed_server", "ec:4+2", 7, "thread", 300..303);
}

#[test]
fn copied_run_survives_a_killed_server_sigbus() {
    survives_one_loss("copied_run_survives_a_killed_server_sigbus", "copies:2", 3, "sigbus", 400..404);
}

#[test]
fn copied_run_survives_a_killed_server_handler_thread() {
    survives_one_loss("copied_run_survives_a_killed_server_handler_thread", "copies:2", 3, "thread", 410..413);
}

/// Two servers killed a few ops apart under ec:2+1 (before the first one's pieces can be
/// rebuilt): the program stops with a message; it never reads wrong data.
#[test]
fn second_loss_before_the_rebuild_stops_the_program() {
    let test = "second_loss_before_the_rebuild_stops_the_program";
    if in_child() {
        scenario();
        return;
    }
    for seed in 0..3u64 {
        let plan = Plan {
            n: 3,
            scheme: "ec:2+1",
            mode: "thread",
            seed: 500 + seed,
            victims: &[0, 1],
            kill_at: 20 + 10 * seed as usize,
            gap: 2,
            ops: 200,
        };
        let out = run_one(test, &plan);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the program must stop: {stdout}\n{stderr}");
        assert!(!stdout.contains("WRONG") && !stdout.contains("FAILOVER-OK"), "{stdout}");
        assert!(
            stderr.contains("rather than returning wrong data") || stderr.contains("memory server 0"),
            "a clear message:\n{stderr}"
        );
    }
}

/// A second loss after the first one's pieces were rebuilt onto the spare server is survived.
#[test]
fn second_loss_after_the_rebuild_is_survived() {
    let test = "second_loss_after_the_rebuild_is_survived";
    if in_child() {
        scenario();
        return;
    }
    // Four servers for ec:2+1: the lost pieces go to the fourth. 600 ops leave the rebuild
    // (one block per request made with nothing in flight) long done by op 400.
    let plan =
        Plan { n: 4, scheme: "ec:2+1", mode: "thread", seed: 600, victims: &[1, 2], kill_at: 10, gap: 390, ops: 600 };
    let out = run_one(test, &plan);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains("FAILOVER-OK"), "{stdout}\n{stderr}");
    let rebuilt = stderr.find("lost pieces rebuilt").expect("the rebuild is reported");
    let second = stderr.match_indices(") lost: ").nth(1).map(|(i, _)| i).expect("the second loss is reported");
    assert!(rebuilt < second, "rebuilt before the second loss:\n{stderr}");
}

/// `none` keeps today's behaviour: a lost server stops the program (tests/failure.rs checks
/// the message); a configuration asking for more pieces than servers is refused up front.
#[test]
fn redundancy_needs_enough_servers() {
    let cfg = Config {
        servers: vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        redundancy: Redundancy::parse("ec:2+1").unwrap(),
        ..Config::default()
    };
    let err = Dlm::init(cfg).err().expect("refused");
    assert!(err.to_string().contains("at least 3"), "{err}");
}
