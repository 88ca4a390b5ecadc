//! Start the real server binary on a free loopback port and talk to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    pub fn start(args: &[&str]) -> Server {
        Self::try_start(args).unwrap_or_else(|e| panic!("server did not start: {e}"))
    }

    /// Start confined to one CPU (the last online one), as `pagewise eval hps-kvcache` starts it:
    /// on a machine of more than one CPU its idle workers then poll before they sleep.
    pub fn start_confined(args: &[&str]) -> Server {
        let cpu = *pagewise_kernel::cpu::online_cpus().expect("online CPUs").last().expect("a CPU");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pagewise-kvcache"));
        // SAFETY: pin_before_exec is async-signal-safe (one syscall, no allocation).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || pagewise_kernel::cpu::pin_before_exec(cpu))
        };
        Self::spawn(cmd, args).unwrap_or_else(|e| panic!("server did not start: {e}"))
    }

    /// Start, or the server's own error message when it refused to (e.g. HPS unavailable).
    pub fn try_start(args: &[&str]) -> Result<Server, String> {
        Self::spawn(Command::new(env!("CARGO_BIN_EXE_pagewise-kvcache")), args)
    }

    fn spawn(mut cmd: Command, args: &[&str]) -> Result<Server, String> {
        let mut child = cmd
            .args(["-p", "0", "-l", "127.0.0.1"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn pagewise-kvcache");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("read listen line");
        match line.trim().strip_prefix("listening on ") {
            Some(addr) => Ok(Server { child, addr: addr.to_string() }),
            // The server printed its reason on stderr (inherited) and exited.
            None => Err(format!("exited with {:?}", child.wait().expect("wait"))),
        }
    }

    pub fn connect(&self) -> Client {
        let s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Client { s }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    pub fn stat(&self, name: &str) -> String {
        pagewise_kvcache::load::stats(&self.addr)
            .expect("stats")
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no stat {name}"))
    }

    pub fn stat_u64(&self, name: &str) -> u64 {
        self.stat(name).parse().expect("numeric stat")
    }

    /// A numeric field of `stats settings`.
    pub fn setting_u64(&self, name: &str) -> u64 {
        pagewise_kvcache::load::settings(&self.addr)
            .expect("stats settings")
            .into_iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no numeric setting {name}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Client {
    pub s: TcpStream,
}

impl Client {
    pub fn send(&mut self, req: &[u8]) {
        self.s.write_all(req).expect("write");
    }

    /// Read exactly `n` bytes.
    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0; n];
        self.s.read_exact(&mut b).expect("read");
        b
    }

    /// Send a request, then read a reply of exactly `expected.len()` bytes and compare; then
    /// check nothing more arrives (a round trip with `version` marks the end).
    pub fn exchange(&mut self, req: &[u8], expected: &[u8]) {
        self.send(req);
        self.send(b"version\r\n");
        let version = format!("VERSION {}\r\n", env!("CARGO_PKG_VERSION"));
        let mut got = vec![0; expected.len() + version.len()];
        if let Err(e) = self.s.read_exact(&mut got) {
            panic!("request {:?}: reading the reply: {e}", String::from_utf8_lossy(&req[..req.len().min(200)]));
        }
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&[expected, version.as_bytes()].concat()),
            "request {:?}",
            String::from_utf8_lossy(&req[..req.len().min(200)])
        );
    }

    /// Wait until the server closes the connection; returns what it sent before.
    pub fn read_to_close(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = [0u8; 4096];
        loop {
            assert!(Instant::now() < deadline, "server did not close the connection");
            match self.s.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return out,
                Err(e) => panic!("read: {e}"),
            }
        }
    }
}
