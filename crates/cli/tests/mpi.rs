//! `pagewise mpi` under Open MPI's real mpirun: rank 0 runs an unmodified program on DLM
//! memory, the other ranks serve it, on one host and across the hosts of a testbed (network
//! namespaces reached through mpirun's rsh agent, `pagewise testbed exec`). The program's
//! output is the plain run's; a rank that dies ends the job with a message and leaves no
//! process behind; started without a launcher, it says how to start it.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{compile, ensure_libpagewise, pagewise, tempdir};
use pagewise_kernel::testbed::{profile, Testbed, TestbedSpec};

/// mpirun as root on a 2-core machine: allowed, and more ranks than cores.
fn mpirun() -> Command {
    assert!(
        Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success()),
        "mpirun not found: `make deps` installs openmpi-bin"
    );
    let mut c = Command::new("mpirun");
    c.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").arg("--oversubscribe");
    c
}

/// Wait for `child` at most `limit`; kill it (and fail) past that.
fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("still running after {limit:?}; stderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn run_job(mut cmd: Command) -> Output {
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(300))
}

/// The number in `pagewise mpi: the memory servers served N requests`.
fn served_requests(stderr: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix("pagewise mpi: the memory servers served ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no closing summary in\n{stderr}"))
}

/// matmul compiled into a private directory (kept while the returned handle lives), and its
/// plain output.
fn matmul(tag: &str) -> (pagewise_kernel::private_dir::PrivateDir, std::path::PathBuf, String) {
    ensure_libpagewise();
    let dir = tempdir(tag);
    let prog = compile("matmul", dir.path());
    let direct = Command::new(&prog).arg("512").output().unwrap();
    assert!(direct.status.success());
    (dir, prog, String::from_utf8(direct.stdout).unwrap())
}

#[test]
fn matmul_under_mpirun_on_one_host_gives_the_plain_output() {
    let (_dir, prog, plain) = matmul("mpi-one-host");
    // As the README shows it, then with a local limit far below the arrays, so that pages
    // travel to the server ranks and back.
    for flags in [&[][..], &["--local-mem", "1M", "--min-alloc", "256K"][..]] {
        let mut cmd = mpirun();
        cmd.args(["-np", "4"]).arg(pagewise()).arg("mpi").args(flags).arg("--").arg(&prog).arg("512");
        let out = run_job(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{flags:?}: {:?}\n{err}", out.status);
        assert_eq!(String::from_utf8_lossy(&out.stdout), plain, "{flags:?}: {err}");
        assert!(err.contains("3 memory server(s)") && err.contains("127.0.0.1:"), "{err}");
        assert!(err.contains("3 allocation(s) on dlm memory"), "{err}");
        if !flags.is_empty() {
            assert!(served_requests(&err) > 100, "pages did not travel:\n{err}");
        }
    }
}

#[test]
fn matmul_across_testbed_hosts_reached_by_the_rsh_agent_gives_the_plain_output() {
    let (_dir, prog, plain) = matmul("mpi-testbed");
    let spec = TestbedSpec::new(format!("m{}", std::process::id() % 10_000_000), 4);
    let bed = Testbed::up(spec.clone(), profile("25gbe").unwrap()).unwrap();
    let hosts: Vec<String> = (0..4).map(|i| bed.host(i)).collect();
    let pw = pagewise();
    // mpirun runs on host 0 and starts the other ranks through the agent, as on a cluster
    // where it would be ssh.
    let mut cmd = Command::new(&pw);
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["testbed", "exec", &hosts[0], "--", "mpirun", "--oversubscribe", "-np", "4", "--host", &hosts.join(",")])
        .args(["--mca", "plm_rsh_agent", &format!("'{} testbed exec'", pw.display())])
        .arg(&pw)
        .args(["mpi", "--local-mem", "1M", "--min-alloc", "256K", "--"])
        .arg(&prog)
        .arg("512");
    let out = run_job(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{err}", out.status);
    assert_eq!(String::from_utf8_lossy(&out.stdout), plain, "{err}");
    assert!(err.contains(&format!("rank 0 on {} runs", hosts[0])), "{err}");
    for (i, host) in hosts.iter().enumerate().skip(1) {
        assert!(err.contains(&format!("rank {i} on {host}: {}:", bed.address(i))), "rank {i}:\n{err}");
    }
    assert!(served_requests(&err) > 100, "pages did not travel:\n{err}");
    // The servers' replies crossed the shaped links.
    let q = bed.link_qdiscs(0).unwrap();
    let sent: Vec<u64> =
        q.lines().filter_map(|l| l.trim().strip_prefix("Sent ")?.split(' ').next()?.parse().ok()).collect();
    assert!(sent.iter().all(|&b| b > 0) && sent.len() == 2, "{q}");
    assert!(bed.down().is_empty());
}

/// The pids of `root`'s descendants.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some(after) = stat.rsplit_once(") ").map(|x| x.1) else { continue };
        if let Some(ppid) = after.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok()) {
            parent.push((pid, ppid));
        }
    }
    let mut out = vec![];
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// The `pagewise mpi` process of rank `rank` among `root`'s descendants.
fn rank_pid(root: u32, rank: u32) -> u32 {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    descendants(root)
        .into_iter()
        .find(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
            String::from_utf8_lossy(&cmd).contains("mpi\0") && env.split(|&b| b == 0).any(|v| v == want.as_bytes())
        })
        .unwrap_or_else(|| panic!("no rank {rank} under {root}"))
}

/// The private directories (`pagewise-run.*` in the temporary directory) process `pid` holds
/// open.
fn private_dirs_held_by(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = std::env::temp_dir().join("pagewise-run.");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap();
    let mut dirs: Vec<_> = fds
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with(&*prefix.to_string_lossy()))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Start `mpirun -np 3 pagewise mpi -- sleep 600`, wait until the program runs, SIGKILL rank
/// `victim`, and return the job's stderr. Nothing of the job may outlive it.
fn kill_rank_mid_run(victim: u32) -> String {
    ensure_libpagewise();
    let mut cmd = mpirun();
    cmd.args(["-np", "3"]).arg(pagewise()).args(["mpi", "--", "sleep", "600"]);
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut text = String::new();
    while !text.contains("memory server(s)") {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "the job ended before it started:\n{text}");
        text.push_str(&line);
    }
    // The list of servers follows; the program runs once it is printed.
    std::thread::sleep(Duration::from_millis(500));
    let root = child.id();
    let job = descendants(root);
    let pid = rank_pid(root, victim);
    let held = private_dirs_held_by(pid);
    pagewise_kernel::net::kill(pid as i32, libc::SIGKILL).unwrap();
    let reader = std::thread::spawn(move || {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
        rest
    });
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the job went on after rank {victim} died");
        std::thread::sleep(Duration::from_millis(50));
    };
    text.push_str(&reader.join().unwrap());
    assert!(!status.success(), "{text}");
    std::thread::sleep(Duration::from_millis(500));
    let left: Vec<u32> = job.into_iter().filter(|p| Path::new(&format!("/proc/{p}/cmdline")).exists()).collect();
    let left: Vec<String> = left
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter(|s| !s.contains(") Z "))
        .collect();
    assert!(left.is_empty(), "processes of the job outlived it: {left:?}\n{text}");
    // A SIGKILLed wrapper cannot remove its private directory (the next run sweeps it after
    // a grace); this test removes the one it caused.
    for dir in held {
        assert!(dir.is_dir(), "{} vanished although its maker was SIGKILLed", dir.display());
        std::fs::remove_dir_all(&dir).unwrap();
    }
    text
}

// Which message comes first is a race: rank 0 (or a server rank) sees the control connection
// close within 50 ms, and mpirun, seeing a rank die, ends the others at about the same time.
// Either way the job ends with a message naming the dead rank.

#[test]
fn a_memory_server_rank_that_dies_ends_the_job_with_a_message() {
    let err = kill_rank_mid_run(2);
    assert!(
        (err.contains("memory server rank 2 on") && err.contains("is gone")) || err.contains("process rank 2"),
        "{err}"
    );
}

#[test]
fn rank_0_dying_stops_the_memory_servers() {
    let err = kill_rank_mid_run(0);
    assert!(err.contains("rank 0 is gone") || err.contains("process rank 0"), "{err}");
}

#[test]
fn without_a_launcher_it_says_how_to_start_and_a_missing_program_fails_every_rank() {
    let out = Command::new(pagewise()).args(["mpi", "--", "true"]).env_remove("PMIX_RANK").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("mpirun -np N pagewise mpi") && err.contains("srun -n N --mpi=pmix"), "{err}");

    let out = Command::new(pagewise())
        .args(["mpi", "--", "true"])
        .env_remove("PMIX_RANK")
        .env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "2")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mpi=pmix"));

    let mut cmd = mpirun();
    cmd.args(["-np", "2"]).arg(pagewise()).args(["mpi", "--", "./no-such-program-here"]);
    let out = run_job(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("./no-such-program-here: no such program"), "{err}");

    let mut cmd = mpirun();
    cmd.args(["-np", "1"]).arg(pagewise()).args(["mpi", "--", "true"]);
    let out = run_job(cmd);
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs 2 or more"));
}
