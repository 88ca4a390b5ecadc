//! The job's control connections: one TCP connection from rank 0 to each memory server rank,
//! held for the whole run. Each side learns at once that the other is gone (the kernel closes
//! a dead process's socket; keepalive finds a dead host), whatever the launcher does about a
//! dead rank — Open MPI's mpirun ends the job, Slurm's srun only with --kill-on-bad-exit —
//! and the orderly end goes over it too.
//!
//! Wire, one line each way, ASCII:
//! - rank 0 → server: `pagewise-mpi v1 SECRET` (the job's secret: a connection without it is
//!   closed, and the server keeps waiting for rank 0);
//! - server → rank 0: `ok RANK`;
//! - at the end, rank 0 → server: `end`; server → rank 0: its statistics (one JSON object,
//!   pagewise_dlm::server::ServerStats), then it closes.
//!
//! Anything else, or the connection closing before `end`, means the other side is gone.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use pagewise_kernel::net;

const HELLO: &str = "pagewise-mpi v1";
/// How long a handshake reply may take.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Rank 0's end of one control connection.
pub struct ToServer {
    pub rank: u32,
    reader: BufReader<TcpStream>,
}

/// What [`ToServer::check`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    /// The connection closed or failed: the server rank is gone.
    Gone(String),
}

impl ToServer {
    /// Connect to `addr`, present the secret and wait for the server's `ok`.
    pub fn connect(addr: SocketAddr, rank: u32, secret: &str, dead_peer_timeout: Option<Duration>) -> Result<Self> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_nodelay(true)?;
        s.write_all(format!("{HELLO} {secret}\n").as_bytes())?;
        s.set_read_timeout(Some(REPLY_TIMEOUT))?;
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim() != format!("ok {rank}") {
            bail!("rank {rank} at {addr} answered {:?} to the handshake", line.trim());
        }
        let s = reader.get_ref();
        s.set_read_timeout(None)?;
        if let Some(t) = dead_peer_timeout {
            net::set_dead_peer_timeout(s.as_raw_fd(), t)?;
        }
        Ok(ToServer { rank, reader })
    }

    /// Whether the server rank is still there (does not block).
    pub fn check(&mut self) -> Liveness {
        let fd = self.reader.get_ref().as_raw_fd();
        match net::poll(fd, Duration::ZERO) {
            Ok(false) => Liveness::Alive,
            // Readable: a server says nothing before `end`, so this is its connection closing.
            Ok(true) => {
                let mut buf = [0u8; 64];
                match net::recv_nonblocking(fd, &mut buf) {
                    Ok(0) => Liveness::Alive,
                    Ok(_) => Liveness::Gone("it sent bytes it should not have".into()),
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        Liveness::Gone("its control connection closed".into())
                    }
                    Err(e) => Liveness::Gone(format!("its control connection failed: {e}")),
                }
            }
            Err(e) => Liveness::Gone(format!("poll on its control connection failed: {e}")),
        }
    }

    /// Tell the server rank the job is over; its statistics (a JSON line).
    pub fn end(mut self, timeout: Duration) -> Result<String> {
        self.reader.get_mut().write_all(b"end\n")?;
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        let mut line = String::new();
        self.reader.read_line(&mut line).with_context(|| format!("rank {}: waiting for its statistics", self.rank))?;
        if line.is_empty() {
            bail!("rank {} closed its control connection instead of ending", self.rank);
        }
        Ok(line.trim().to_string())
    }
}

/// A server rank's end: listening until rank 0 connects with the secret.
pub struct FromRank0 {
    listener: TcpListener,
    rank: u32,
    secret: String,
}

/// What rank 0 said, or that it is gone.
#[derive(Debug, PartialEq, Eq)]
pub enum Order {
    /// Nothing yet.
    None,
    End,
    Gone(String),
}

/// A server rank's accepted control connection.
pub struct Rank0Link {
    reader: BufReader<TcpStream>,
}

impl FromRank0 {
    /// Listen on `ip`, any port.
    pub fn listen(ip: std::net::Ipv4Addr, rank: u32, secret: &str) -> Result<Self> {
        let listener = TcpListener::bind((ip, 0)).with_context(|| format!("listening for rank 0 on {ip}"))?;
        Ok(FromRank0 { listener, rank, secret: secret.to_string() })
    }

    pub fn port(&self) -> Result<u16> {
        Ok(self.listener.local_addr()?.port())
    }

    /// Wait up to `step` for rank 0. A connection that does not present the secret within the
    /// reply timeout is closed and waiting goes on. `Ok(None)`: nobody yet.
    pub fn accept(&self, step: Duration) -> Result<Option<Rank0Link>> {
        if !net::poll(self.listener.as_raw_fd(), step)? {
            return Ok(None);
        }
        let (s, peer) = self.listener.accept()?;
        s.set_read_timeout(Some(REPLY_TIMEOUT))?;
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        let started = Instant::now();
        let ok = reader.read_line(&mut line).is_ok() && line.trim_end() == format!("{HELLO} {}", self.secret);
        if !ok {
            eprintln!(
                "pagewise mpi: rank {}: refused a control connection from {peer} without the job's secret ({:.1} s)",
                self.rank,
                started.elapsed().as_secs_f64()
            );
            return Ok(None);
        }
        reader.get_mut().write_all(format!("ok {}\n", self.rank).as_bytes())?;
        reader.get_ref().set_read_timeout(None)?;
        Ok(Some(Rank0Link { reader }))
    }
}

impl Rank0Link {
    /// Wait up to `step` for rank 0's order.
    pub fn poll(&mut self, step: Duration) -> Order {
        match net::poll(self.reader.get_ref().as_raw_fd(), step) {
            Ok(false) => Order::None,
            Err(e) => Order::Gone(format!("poll failed: {e}")),
            Ok(true) => {
                let mut line = String::new();
                match self.reader.read_line(&mut line) {
                    Ok(0) => Order::Gone("its control connection closed".into()),
                    Ok(_) if line.trim() == "end" => Order::End,
                    Ok(_) => Order::Gone(format!("it sent {:?}", line.trim())),
                    Err(e) => Order::Gone(format!("its control connection failed: {e}")),
                }
            }
        }
    }

    /// Send the statistics line and close.
    pub fn finish(mut self, stats_json: &str) -> Result<()> {
        self.reader.get_mut().write_all(format!("{}\n", stats_json.trim()).as_bytes())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn handshake_end_and_loss_over_loopback() {
        let listen = FromRank0::listen(Ipv4Addr::LOCALHOST, 3, "s3cr3t").unwrap();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port().unwrap()));
        // A stranger without the secret is refused; rank 0 is then accepted.
        let server = std::thread::spawn(move || {
            let mut link = None;
            while link.is_none() {
                link = listen.accept(Duration::from_millis(100)).unwrap();
            }
            let mut link = link.unwrap();
            loop {
                match link.poll(Duration::from_millis(100)) {
                    Order::None => continue,
                    Order::End => break link.finish("{\"requests\":7}").unwrap(),
                    Order::Gone(why) => panic!("{why}"),
                }
            }
        });
        let mut stranger = TcpStream::connect(addr).unwrap();
        stranger.write_all(b"pagewise-mpi v1 guess\n").unwrap();
        let mut rest = String::new();
        BufReader::new(&stranger).read_line(&mut rest).unwrap();
        assert_eq!(rest, "", "a stranger gets nothing");
        let mut to = ToServer::connect(addr, 3, "s3cr3t", Some(Duration::from_secs(9))).unwrap();
        assert_eq!(to.check(), Liveness::Alive);
        assert_eq!(to.end(Duration::from_secs(5)).unwrap(), "{\"requests\":7}");
        server.join().unwrap();
    }

    #[test]
    fn a_server_rank_that_dies_is_seen_gone_and_so_is_rank_0() {
        let listen = FromRank0::listen(Ipv4Addr::LOCALHOST, 1, "k").unwrap();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port().unwrap()));
        let server = std::thread::spawn(move || loop {
            if let Some(link) = listen.accept(Duration::from_millis(100)).unwrap() {
                return link;
            }
        });
        let mut to = ToServer::connect(addr, 1, "k", None).unwrap();
        let link = server.join().unwrap();
        drop(link);
        let deadline = Instant::now() + Duration::from_secs(5);
        while to.check() == Liveness::Alive && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(matches!(to.check(), Liveness::Gone(_)));

        let listen = FromRank0::listen(Ipv4Addr::LOCALHOST, 1, "k").unwrap();
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port().unwrap()));
        let rank0 = std::thread::spawn(move || ToServer::connect(addr, 1, "k", None).unwrap());
        let mut link = loop {
            if let Some(l) = listen.accept(Duration::from_millis(100)).unwrap() {
                break l;
            }
        };
        drop(rank0.join().unwrap());
        assert!(matches!(link.poll(Duration::from_secs(5)), Order::Gone(_)));
    }
}
