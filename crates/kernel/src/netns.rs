//! Network namespaces, the links between them and their traffic shaping: the pieces of the
//! DLM testbed ([`crate::testbed`]), which makes hosts of a cluster out of namespaces of one
//! machine.
//!
//! Namespaces, links, addresses and qdiscs are made with iproute2 (`ip -n NS …`, `tc -n NS …`),
//! the kernel's own netlink client: a tbf qdisc alone is a rate, a burst, a limit and the rate
//! tables `tc` computes, which a hand-written netlink encoder would only repeat. Entering a
//! namespace is a syscall of ours (setns(2)), so a process enters it without a helper process
//! and a thread can enter and leave it.
//!
//! Shared preconditions: root (CAP_SYS_ADMIN and CAP_NET_ADMIN); names are checked before any
//! tool runs (namespace names are file names under /run/netns, device names at most 15 bytes,
//! IFNAMSIZ). Errors name the command and carry its stderr, or the syscall and its errno.
//! Everything created goes through a [`SettingsGuard`], which removes it.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::guard::{SettingsGuard, Undo};

/// Where `ip netns add` keeps a namespace (a bind mount of its nsfs file), ip-netns(8).
pub const NETNS_DIR: &str = "/run/netns";

/// Longest device name, IFNAMSIZ - 1 (netdevice(7)).
const MAX_DEVICE_NAME: usize = 15;

/// Check a namespace or device name: letters, digits, `-` and `_`, not empty, no longer than
/// `max` bytes (namespace names become file names; device names must fit IFNAMSIZ).
pub fn check_name(what: &str, name: &str, max: usize) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "{what} name {name:?}: use 1..{max} letters, digits, '-' or '_', not starting with '-'"
        )))
    }
}

fn check_netns(name: &str) -> Result<()> {
    check_name("network namespace", name, 64)
}

fn check_device(name: &str) -> Result<()> {
    check_name("network device", name, MAX_DEVICE_NAME)
}

/// The file of namespace `name`.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(name)
}

/// True when namespace `name` exists (`ip netns add` made its file).
pub fn exists(name: &str) -> bool {
    netns_path(name).exists()
}

/// Run an iproute2 tool and return its stdout; a failure names the whole command line and
/// carries the tool's stderr.
fn iproute(program: &str, args: &[&str]) -> Result<String> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().map_err(|e| Error::Command {
        command: command.clone(),
        detail: format!("cannot run {program}: {e} (install iproute2)"),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(Error::Command { command, detail: format!("{}: {stderr}", out.status) });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -n NS ARGS…`
fn ip_in(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    iproute("ip", &all)
}

/// `tc -n NS ARGS…`
fn tc_in(ns: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["-n", ns];
    all.extend_from_slice(args);
    iproute("tc", &all)
}

/// Create namespace `name`, recorded in `guard` (which deletes it, ending what still runs
/// inside). Fails when it exists: it would be someone else's.
pub fn add(guard: &SettingsGuard, name: &str) -> Result<()> {
    check_netns(name)?;
    if exists(name) {
        return Err(Error::Invalid(format!("network namespace {name} exists already (pagewise testbed down?)")));
    }
    iproute("ip", &["netns", "add", name])?;
    guard.push(Undo::DeleteNetns { name: name.to_string() });
    Ok(())
}

/// The pids of the processes in namespace `name` (`ip netns pids`).
pub fn pids(name: &str) -> Result<Vec<i32>> {
    check_netns(name)?;
    let out = iproute("ip", &["netns", "pids", name])?;
    Ok(out.split_whitespace().filter_map(|p| p.parse().ok()).collect())
}

/// Delete namespace `name`: what still runs inside gets SIGTERM, then SIGKILL after
/// `grace`, and its name is removed (the kernel frees the namespace, its devices and their
/// qdiscs when the last process and mount are gone). A namespace that is already gone is no
/// error.
pub fn delete(name: &str, grace: Duration) -> Result<()> {
    check_netns(name)?;
    // Whoever else tears it down meanwhile (a testbed's journal replayed by `down`) has done
    // this call's work: a step that fails because the namespace is gone succeeds.
    match end_and_delete(name, grace) {
        Err(_) if !exists(name) => Ok(()),
        done => done,
    }
}

fn end_and_delete(name: &str, grace: Duration) -> Result<()> {
    if !exists(name) {
        return Ok(());
    }
    let me = std::process::id() as i32;
    let others = |pids: Vec<i32>| pids.into_iter().filter(|&p| p != me).collect::<Vec<_>>();
    let running = others(pids(name)?);
    if !running.is_empty() {
        for &p in &running {
            let _ = crate::net::kill(p, libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && !others(pids(name)?).is_empty() {
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in others(pids(name)?) {
            let _ = crate::net::kill(p, libc::SIGKILL);
        }
    }
    iproute("ip", &["netns", "delete", name])?;
    Ok(())
}

/// Create a bridge `name` in namespace `ns`, recorded in `guard`.
pub fn add_bridge(guard: &SettingsGuard, ns: &str, name: &str) -> Result<()> {
    check_device(name)?;
    ip_in(ns, &["link", "add", name, "type", "bridge"])?;
    guard.push(Undo::DeleteLink { netns: ns.to_string(), name: name.to_string() });
    Ok(())
}

/// Create a veth pair: `name` in namespace `ns`, its peer `peer` in namespace `peer_ns`
/// (veth(4)); recorded in `guard` (deleting one end deletes both).
pub fn add_veth(guard: &SettingsGuard, ns: &str, name: &str, peer_ns: &str, peer: &str) -> Result<()> {
    check_device(name)?;
    check_device(peer)?;
    check_netns(peer_ns)?;
    ip_in(ns, &["link", "add", name, "type", "veth", "peer", "name", peer, "netns", peer_ns])?;
    guard.push(Undo::DeleteLink { netns: ns.to_string(), name: name.to_string() });
    Ok(())
}

/// Delete device `name` of namespace `ns`; gone already (or its namespace) is no error.
pub fn delete_link(ns: &str, name: &str) -> Result<()> {
    check_device(name)?;
    if !exists(ns) || !link_exists(ns, name) {
        return Ok(());
    }
    match ip_in(ns, &["link", "delete", name]) {
        // Gone meanwhile: another teardown of the same testbed (its namespace deleted, which
        // also ends the `ip` running inside it) did this call's work.
        Err(_) if !exists(ns) || !link_exists(ns, name) => Ok(()),
        other => other.map(drop),
    }
}

fn link_exists(ns: &str, name: &str) -> bool {
    ip_in(ns, &["link", "show", "dev", name]).is_ok()
}

/// Attach `dev` to bridge `bridge` (both in `ns`).
pub fn set_master(ns: &str, dev: &str, bridge: &str) -> Result<()> {
    check_device(dev)?;
    check_device(bridge)?;
    ip_in(ns, &["link", "set", "dev", dev, "master", bridge]).map(drop)
}

/// Bring `dev` of `ns` up.
pub fn set_up(ns: &str, dev: &str) -> Result<()> {
    check_device(dev)?;
    ip_in(ns, &["link", "set", "dev", dev, "up"]).map(drop)
}

/// Set the MTU of `dev` of `ns`.
pub fn set_mtu(ns: &str, dev: &str, mtu: u32) -> Result<()> {
    check_device(dev)?;
    if !(68..=65535).contains(&mtu) {
        return Err(Error::Invalid(format!("MTU {mtu}: give 68..65535")));
    }
    ip_in(ns, &["link", "set", "dev", dev, "mtu", &mtu.to_string()]).map(drop)
}

/// Give `dev` of `ns` the address `cidr` (`10.77.0.2/24`).
pub fn add_address(ns: &str, dev: &str, cidr: &str) -> Result<()> {
    check_device(dev)?;
    ip_in(ns, &["addr", "add", cidr, "dev", dev]).map(drop)
}

/// A token-bucket shaping of a device's transmit side (tc-tbf(8)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    /// Bytes per second the link carries in the long run.
    pub rate_bytes_per_s: u64,
    /// Bytes that may leave at once when the bucket is full (at least one packet).
    pub burst_bytes: u64,
    /// Longest a packet may wait in the queue before it is dropped.
    pub max_queue_delay: Duration,
}

impl TokenBucket {
    /// The `tc qdisc … tbf` arguments (`rate` in bits per second: tc's `Bps` suffix means
    /// bytes, but its output speaks bits, so bits are what a reader compares).
    pub fn tc_args(&self) -> Vec<String> {
        vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.rate_bytes_per_s.saturating_mul(8)),
            "burst".into(),
            self.burst_bytes.to_string(),
            "latency".into(),
            format!("{}us", self.max_queue_delay.as_micros().max(1)),
        ]
    }
}

/// Shape `dev` of `ns` (its transmit side) with `bucket`, replacing its root qdisc; recorded in
/// `guard` (which removes the qdisc, giving the device its default back).
pub fn set_rate(guard: &SettingsGuard, ns: &str, dev: &str, bucket: &TokenBucket) -> Result<()> {
    check_device(dev)?;
    if bucket.rate_bytes_per_s == 0 || bucket.burst_bytes == 0 {
        return Err(Error::Invalid(format!("{dev}: a rate and a burst of zero carry nothing")));
    }
    let args = bucket.tc_args();
    let mut all = vec!["qdisc", "replace", "dev", dev, "root"];
    all.extend(args.iter().map(String::as_str));
    tc_in(ns, &all)?;
    guard.push_once(Undo::DeleteQdisc { netns: ns.to_string(), dev: dev.to_string() });
    Ok(())
}

/// Remove the root qdisc of `dev` of `ns` (the device gets its default back); a device or
/// namespace that is gone, or has no qdisc of ours, is no error.
pub fn delete_root_qdisc(ns: &str, dev: &str) -> Result<()> {
    check_device(dev)?;
    if !exists(ns) || !link_exists(ns, dev) {
        return Ok(());
    }
    match tc_in(ns, &["qdisc", "delete", "dev", dev, "root"]) {
        // The default qdisc cannot be deleted ("Cannot delete qdisc with handle of zero"):
        // nothing of ours is there.
        Err(Error::Command { detail, .. }) if detail.contains("handle of zero") || detail.contains("No such file") => {
            Ok(())
        }
        // Gone meanwhile, as in `delete_link`.
        Err(_) if !exists(ns) || !link_exists(ns, dev) => Ok(()),
        other => other.map(drop),
    }
}

/// `tc -s qdisc show dev DEV` in `ns`: the root qdisc and its counters, as tc prints them.
pub fn qdisc_show(ns: &str, dev: &str) -> Result<String> {
    check_device(dev)?;
    tc_in(ns, &["-s", "qdisc", "show", "dev", dev])
}

/// An open namespace file: what setns(2) takes.
pub struct NetnsFile(OwnedFd);

impl NetnsFile {
    /// Open namespace `name` (/run/netns/NAME); close-on-exec.
    pub fn open(name: &str) -> Result<Self> {
        check_netns(name)?;
        let path = netns_path(name);
        let f = File::open(&path).map_err(|source| Error::Read { path, source })?;
        Ok(NetnsFile(f.into()))
    }

    /// The calling thread's network namespace (/proc/thread-self/ns/net).
    pub fn current() -> Result<Self> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let f = File::open(&path).map_err(|source| Error::Read { path, source })?;
        Ok(NetnsFile(f.into()))
    }

    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Move the calling thread into this namespace (setns(2), CLONE_NEWNET): the sockets it
    /// creates from now on, and the threads and processes it starts, are in it.
    pub fn enter(&self) -> Result<()> {
        setns_net(self.raw_fd()).map_err(|source| Error::Syscall { call: "setns(CLONE_NEWNET)", source })
    }
}

/// setns(2) into the network namespace of `fd`; returns the errno. Async-signal-safe: may run
/// between fork and exec (a child entering its host before it execs).
pub fn setns_net(fd: RawFd) -> io::Result<()> {
    // SAFETY: setns only reads the descriptor number; an invalid one fails with EBADF.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread inside another network namespace until dropped, when it returns to the
/// namespace it was in.
pub struct Entered {
    previous: NetnsFile,
}

/// Move the calling thread into namespace `name` until the returned guard drops.
pub fn enter(name: &str) -> Result<Entered> {
    let previous = NetnsFile::current()?;
    NetnsFile::open(name)?.enter()?;
    Ok(Entered { previous })
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Err(e) = self.previous.enter() {
            // A thread left in the wrong namespace would reach the wrong hosts: stop here.
            panic!("cannot return to the previous network namespace: {e}");
        }
    }
}

/// Give the calling process a UTS namespace of its own (unshare(2), CLONE_NEWUTS) whose host
/// name is `hostname`: a process entering a testbed host sees that host's name, as an MPI
/// launcher expects of a remote host.
pub fn set_own_hostname(hostname: &str) -> Result<()> {
    check_name("host", hostname, 64)?;
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(libc::CLONE_NEWUTS) } != 0 {
        return Err(Error::last_os("unshare(CLONE_NEWUTS)"));
    }
    // SAFETY: the pointer and length describe `hostname`'s bytes, which outlive the call.
    if unsafe { libc::sethostname(hostname.as_ptr() as *const libc::c_char, hostname.len()) } != 0 {
        return Err(Error::last_os("sethostname"));
    }
    Ok(())
}

/// This machine's (or this UTS namespace's) host name (gethostname(2)).
pub fn hostname() -> Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates within it on success.
    if unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } != 0 {
        return Err(Error::last_os("gethostname"));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The inode of the calling thread's network namespace: two processes with the same inode
/// share their network (and can talk over loopback).
pub fn current_netns_id() -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let path = PathBuf::from("/proc/thread-self/ns/net");
    std::fs::metadata(&path).map(|m| m.ino()).map_err(|source| Error::Read { path, source })
}

/// An IPv4 address of an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfaceAddress {
    pub interface: String,
    pub address: std::net::Ipv4Addr,
    /// The network's prefix length (24 for a /24).
    pub prefix_len: u8,
}

/// The IPv4 addresses of the calling thread's network namespace (getifaddrs(3)).
pub fn ipv4_addresses() -> Result<Vec<InterfaceAddress>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(Error::last_os("getifaddrs"));
    }
    let mut out = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_netmask.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr whose family says how to read the rest.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET: both are sockaddr_in.
        let (addr, mask) =
            unsafe { (*(ifa.ifa_addr as *const libc::sockaddr_in), *(ifa.ifa_netmask as *const libc::sockaddr_in)) };
        // SAFETY: ifa_name is a NUL-terminated interface name.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        out.push(InterfaceAddress {
            interface: name,
            address: std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            prefix_len: u32::from_be(mask.sin_addr.s_addr).count_ones() as u8,
        });
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_before_any_tool_runs() {
        assert!(check_device("eth0").is_ok());
        assert!(check_device("pwtb-h12").is_ok());
        assert!(check_device("a-very-long-devname").is_err());
        assert!(check_device("").is_err());
        assert!(check_device("../x").is_err());
        assert!(check_device("-n").is_err());
        assert!(check_netns("pwtb-h0").is_ok());
        assert!(check_netns("a b").is_err());
        assert!(delete("no/such", Duration::ZERO).is_err());
    }

    #[test]
    fn tbf_arguments_speak_bits() {
        let b = TokenBucket {
            rate_bytes_per_s: 2_500_000_000,
            burst_bytes: 65536,
            max_queue_delay: Duration::from_millis(2),
        };
        assert_eq!(b.tc_args(), ["tbf", "rate", "20000000000bit", "burst", "65536", "latency", "2000us"]);
    }

    #[test]
    fn loopback_has_its_ipv4_address() {
        let all = ipv4_addresses().unwrap();
        assert!(all.iter().any(|a| a.interface == "lo" && a.address.is_loopback() && a.prefix_len == 8), "{all:?}");
    }

    #[test]
    fn a_thread_enters_its_own_namespace_and_returns() {
        let before = current_netns_id().unwrap();
        let here = NetnsFile::current().unwrap();
        here.enter().unwrap();
        assert_eq!(current_netns_id().unwrap(), before);
        assert!(NetnsFile::open("pagewise-no-such-netns").is_err());
        let e = setns_net(-1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF));
    }
}
