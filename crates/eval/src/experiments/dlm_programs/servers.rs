//! The memory servers of one DLM run of dlm-programs: fresh ones for every run, started by the
//! experiment on its server hosts ([`ServerHosts`]: this host's loopback, or with `--net
//! PROFILE` testbed hosts of their own), and the `pagewise run` command that puts a program on
//! them (run from the client's host, where the caller stands).

use std::path::Path;
use std::process::Command;

use pagewise_dlm::auth::{Secret, SECRET_ENV};
use pagewise_dlm::process::ServerProcess;

use crate::net::ServerHosts;
use crate::programs::{DlmFlags, Job};

/// Capacity of each server: far above what the quick and full inputs store.
const CAPACITY: &str = "4G";

/// Servers for one run and the secret they admit; stopped when dropped.
pub struct RunServers {
    servers: Vec<ServerProcess>,
    secret: Secret,
}

impl RunServers {
    /// Start `count` servers on `hosts` (each testbed server host in turn) with a new secret.
    pub fn start(hosts: &ServerHosts, pagewise: &Path, count: usize) -> anyhow::Result<Self> {
        let secret = Secret::generate()?;
        let servers =
            (0..count).map(|_| hosts.spawn(pagewise, CAPACITY, &secret)).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(RunServers { servers, secret })
    }

    /// The servers' HOST:PORT addresses.
    pub fn addresses(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// `pagewise run FLAGS --servers A,B -- PROGRAM` for `job`, the secret in its environment
    /// (never in argv). `flags.servers` is ignored: the program uses these servers.
    pub fn command(&self, pagewise: &Path, job: &Job, flags: &DlmFlags) -> Command {
        let mut args = flags.args();
        // DlmFlags asks `pagewise run` to spawn its own servers (on the client's host): swap
        // that pair for these servers' addresses.
        if let Some(i) = args.iter().position(|a| a == "--spawn-servers") {
            args.drain(i..i + 2);
        }
        args.extend(["--servers".to_string(), self.addresses().join(",")]);
        let mut cmd = Command::new(pagewise);
        cmd.args(args).arg("--").args(&job.argv).current_dir(&job.cwd);
        for (k, v) in &job.env {
            cmd.env(k, v);
        }
        cmd.env(SECRET_ENV, self.secret.as_env_value());
        cmd
    }
}
