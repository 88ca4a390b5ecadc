//! Where an experiment's memory servers run: on this host over loopback (the default), or with
//! `pagewise eval NAME --net PROFILE` on other hosts of a testbed (crates/kernel/src/testbed.rs)
//! behind links shaped to that network profile, the experiment's client on a host of its own.
//!
//! An experiment asks [`ServerHosts`] for its servers and runs its client side under
//! [`ServerHosts::enter_client`]; the same code then measures either placement. The testbed is
//! made for the run and removed after it (a settings guard). Latency is what the veth path
//! gives (this kernel has no netem): [`ServerHosts::record`] measures it, and the bandwidth a
//! bulk TCP stream gets, between the client host and a server host, and puts both beside the
//! profile's nominal rate in the report.

use pagewise_dlm::auth::Secret;
use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::Instant;

use anyhow::Context as _;
use pagewise_dlm::process::ServerProcess;
use pagewise_kernel::netns;
use pagewise_kernel::testbed::{NetProfile, Testbed, TestbedSpec};
use serde_json::json;

use crate::{Report, Summary};

/// A testbed for one experiment run: host 0 is the client's, hosts 1.. the servers'.
pub struct Net {
    bed: Testbed,
}

impl Net {
    /// A testbed of `1 + server_hosts` hosts shaped to `profile`, named after this process.
    pub fn up(profile: &'static NetProfile, server_hosts: usize) -> anyhow::Result<Self> {
        let spec = TestbedSpec::new(format!("pe{}", std::process::id() % 1_000_000), 1 + server_hosts.max(1));
        let bed = Testbed::up(spec, profile).context("setting up the testbed (root and iproute2 needed)")?;
        Ok(Net { bed })
    }

    pub fn profile(&self) -> &'static NetProfile {
        self.bed.profile()
    }

    /// Number of server hosts.
    pub fn server_hosts(&self) -> usize {
        self.bed.spec().hosts - 1
    }

    /// Start `pagewise dlm-server` on server host `i` (1-based), listening on its address.
    pub fn spawn_server(&self, bin: &Path, i: usize, capacity: &str, secret: &Secret) -> anyhow::Result<ServerProcess> {
        let host = self.bed.host(i);
        let ns = netns::NetnsFile::open(&host)?;
        let fd = ns.raw_fd();
        let mut cmd = std::process::Command::new(bin);
        // SAFETY: setns is async-signal-safe; `ns` outlives the spawn, which returns after exec.
        unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || netns::setns_net(fd)) };
        let server = ServerProcess::spawn_cmd(cmd, &format!("{}:0", self.bed.address(i)), capacity, secret)
            .with_context(|| format!("starting a memory server on {host}"))?;
        drop(ns);
        Ok(server)
    }

    /// Move the calling thread (and what it starts from now on) to the client host.
    pub fn enter_client(&self) -> anyhow::Result<netns::Entered> {
        Ok(netns::enter(&self.bed.host(0))?)
    }

    /// Round trips of one byte (µs each) and the GB/s of a bulk TCP stream, from server host 1
    /// to the client host.
    pub fn measure_link(&self, round_trips: usize, stream_bytes: usize) -> anyhow::Result<(Vec<f64>, f64)> {
        let listener = {
            let _on = netns::enter(&self.bed.host(0))?;
            TcpListener::bind(format!("{}:0", self.bed.address(0)))?
        };
        let addr = listener.local_addr()?;
        let server_host = self.bed.host(1);
        let sender = std::thread::spawn(move || -> anyhow::Result<()> {
            let _on = netns::enter(&server_host)?;
            let mut s = TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            let mut b = [0u8; 1];
            for _ in 0..round_trips {
                s.read_exact(&mut b)?;
                s.write_all(&b)?;
            }
            let chunk = vec![7u8; 1 << 20];
            let mut sent = 0;
            while sent < stream_bytes {
                let n = chunk.len().min(stream_bytes - sent);
                s.write_all(&chunk[..n])?;
                sent += n;
            }
            Ok(())
        });
        let (mut c, _) = listener.accept()?;
        c.set_nodelay(true)?;
        let mut rtt = Vec::with_capacity(round_trips);
        let mut b = [1u8; 1];
        for _ in 0..round_trips {
            let t = Instant::now();
            c.write_all(&b)?;
            c.read_exact(&mut b)?;
            rtt.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut buf = vec![0u8; 1 << 20];
        let t = Instant::now();
        let mut got = 0;
        while got < stream_bytes {
            let n = c.read(&mut buf)?;
            anyhow::ensure!(n > 0, "the stream ended after {got} of {stream_bytes} bytes");
            got += n;
        }
        let gbps = stream_bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
        sender.join().map_err(|_| anyhow::anyhow!("the link's sender panicked"))??;
        Ok((rtt, gbps))
    }
}

/// The memory servers' hosts of one experiment run: this host, or a testbed.
pub struct ServerHosts {
    net: Option<Net>,
    next: Cell<usize>,
}

impl ServerHosts {
    /// Servers on this host (`net` None), or on `server_hosts` testbed hosts shaped to `net`.
    pub fn new(net: Option<&'static NetProfile>, server_hosts: usize) -> anyhow::Result<Self> {
        let net = net.map(|p| Net::up(p, server_hosts)).transpose()?;
        Ok(ServerHosts { net, next: Cell::new(0) })
    }

    /// The testbed, if the servers are on one.
    pub fn net(&self) -> Option<&Net> {
        self.net.as_ref()
    }

    /// Start a memory server that admits clients knowing `secret`: on this host's loopback, or
    /// on the next testbed server host in turn.
    pub fn spawn(&self, bin: &Path, capacity: &str, secret: &Secret) -> anyhow::Result<ServerProcess> {
        match &self.net {
            None => Ok(ServerProcess::spawn(bin, capacity, secret)?),
            Some(net) => {
                let i = self.next.get() % net.server_hosts();
                self.next.set(i + 1);
                net.spawn_server(bin, 1 + i, capacity, secret)
            }
        }
    }

    /// The addresses (IP only) of the testbed's server hosts, in the order [`Self::spawn`]
    /// uses them; None on this host.
    pub fn server_addresses(&self) -> Option<Vec<String>> {
        self.net.as_ref().map(|n| (1..=n.server_hosts()).map(|i| n.bed.address(i)).collect())
    }

    /// Run the caller's client side on the testbed's client host until the guard drops (on
    /// this host: nothing to do).
    pub fn enter_client(&self) -> anyhow::Result<Option<netns::Entered>> {
        self.net.as_ref().map(Net::enter_client).transpose()
    }

    /// Measure the link (on a testbed) and add the profile, its nominal rate, and the measured
    /// round trip and stream bandwidth to `report`.
    pub fn record(&self, report: &mut Report) -> anyhow::Result<()> {
        let Some(net) = &self.net else { return Ok(()) };
        let p = net.profile();
        let (rtt, gbps) = net.measure_link(2000, 256 << 20)?;
        let s = Summary::of(&rtt);
        report.figure("net_profile", p.name);
        if let Some(r) = p.rate_bytes_per_s {
            report.figure("net_nominal_gb_s", r as f64 / 1e9);
        }
        report.figure("net_rtt_1b_us", s.median);
        report.figure("net_rtt_1b_min_us", s.min);
        report.figure("net_stream_gb_s", gbps);
        report.note(format!(
            "Network profile {}: {}. Memory servers on {} testbed host(s), the client on another, every link a veth \
             pair to a bridge shaped with tbf on both ends (crates/kernel/src/testbed.rs). Measured in this run between \
             the client's host and a server's: a 1-byte TCP round trip of {:.1} µs median ({:.1} µs min; the veth \
             path's own latency: no delay is added, this kernel has no netem), and a bulk TCP stream of {gbps:.2} GB/s{}.",
            p.name,
            p.source,
            net.server_hosts(),
            s.median,
            s.min,
            match p.rate_bytes_per_s {
                Some(r) => format!(" against the profile's {:.3} GB/s", r as f64 / 1e9),
                None => String::new(),
            }
        ));
        let data = json!({"net_profile": p.name, "rtt_1b_us": rtt, "stream_gb_s": gbps});
        match &mut report.data {
            serde_json::Value::Array(a) => a.push(data),
            serde_json::Value::Null => report.data = json!([data]),
            other => *other = json!([other.take(), data]),
        }
        Ok(())
    }
}
