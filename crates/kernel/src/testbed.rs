//! A cluster on one machine: hosts are network namespaces, each with one link (a veth pair)
//! to a switch (a bridge in a namespace of its own), every link shaped to a named network
//! profile with a token bucket on both of its ends, as a full-duplex NIC and its switch port.
//!
//! ```text
//!   NAME-h0          NAME-h1               NAME-sw
//!   eth0 10.77.0.1   eth0 10.77.0.2   …    h0 h1 … ── br0
//!     └──────────────────┴─── veth pairs ───┘
//! ```
//!
//! Nothing of the testbed is in the machine's own namespace: its addresses (a private /24,
//! 10.77.0.0/24 unless told otherwise) exist only inside its namespaces, which have no route
//! elsewhere, so all of its traffic stays between its hosts. Everything is made through a
//! [`SettingsGuard`] owned by the [`Testbed`]: dropping it, a panic, SIGINT/SIGTERM, or (after a
//! SIGKILL) the next guard created on the machine removes qdiscs, devices and namespaces.
//!
//! The kernel here has tbf and htb but not netem, so no delay is added: latency is what the
//! veth path gives, measured by the experiments that use the testbed (`crates/eval/src/net.rs`)
//! and reported beside each profile.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::guard::{SettingsGuard, Undo};
use crate::netns::{self, TokenBucket};

/// Where testbeds describe themselves (`pagewise testbed status`, `exec`).
pub const STATE_DIR: &str = "/run/pagewise/testbed";

/// The switch side of every host's link, in the switch namespace.
const BRIDGE: &str = "br0";
/// Each host's end of its link.
pub const HOST_DEVICE: &str = "eth0";
/// Jumbo frames, as clusters of 25/100 GbE are usually set up (and as the veth path is
/// cheapest per byte).
pub const MTU: u32 = 9000;

/// A network whose links the testbed imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct NetProfile {
    /// `--net NAME`.
    pub name: &'static str,
    /// Each direction of each host's link, bytes per second; `None`: not shaped.
    pub rate_bytes_per_s: Option<u64>,
    /// What it is and where its bandwidth comes from.
    pub source: &'static str,
}

/// The profiles, slowest first.
pub const PROFILES: &[NetProfile] = &[
    NetProfile {
        name: "10gbe",
        rate_bytes_per_s: Some(1_250_000_000),
        source: "10 Gigabit Ethernet, IEEE Std 802.3ae-2002: 10 Gbit/s MAC data rate = 1.25 GB/s each way",
    },
    NetProfile {
        name: "myrinet-10g-x2",
        rate_bytes_per_s: Some(2_500_000_000),
        source: "the seed's cluster nodes: two Myri-10G ports (10 Gbit/s data rate each, Myricom Myri-10G) = \
                 2.5 GB/s each way (issue 24)",
    },
    NetProfile {
        name: "25gbe",
        rate_bytes_per_s: Some(3_125_000_000),
        source: "25 Gigabit Ethernet, IEEE Std 802.3by-2016: 25 Gbit/s MAC data rate = 3.125 GB/s each way",
    },
    NetProfile {
        name: "100gbe",
        rate_bytes_per_s: Some(12_500_000_000),
        source: "100 Gigabit Ethernet, IEEE Std 802.3ba-2010: 100 Gbit/s MAC data rate = 12.5 GB/s each way",
    },
    NetProfile {
        name: "unshaped",
        rate_bytes_per_s: None,
        source: "veth pairs and a bridge with no qdisc of ours: whatever this machine's kernel path carries",
    },
];

/// The profile called `name`.
pub fn profile(name: &str) -> Result<&'static NetProfile> {
    PROFILES.iter().find(|p| p.name == name).ok_or_else(|| {
        let names: Vec<&str> = PROFILES.iter().map(|p| p.name).collect();
        Error::Invalid(format!("no network profile {name:?}; known: {}", names.join(", ")))
    })
}

impl NetProfile {
    /// The token bucket of each end of a link, `None` when unshaped. The burst is one 64 KiB
    /// GSO packet or 20 µs at the rate, whichever is larger: tbf must pass a whole packet at
    /// once, and the bucket refills on an hrtimer whose wake-ups come tens of µs apart on a
    /// busy VM, so a smaller bucket would carry less than the rate. A fault's reply of a few
    /// KiB thus crosses a link at the veth's own speed; larger transfers are paced at the
    /// profile's rate. Packets wait at most 2 ms in the queue (a switch port's buffer at these
    /// rates holds about that), then are dropped.
    pub fn token_bucket(&self) -> Option<TokenBucket> {
        self.rate_bytes_per_s.map(|rate| TokenBucket {
            rate_bytes_per_s: rate,
            burst_bytes: (64u64 << 10).max(rate / 50_000),
            max_queue_delay: Duration::from_millis(2),
        })
    }
}

/// What a testbed is made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedSpec {
    /// 1..8 letters and digits; hosts are NAME-h0, NAME-h1, …
    pub name: String,
    /// Number of hosts, 1..=64.
    pub hosts: usize,
    /// The first three octets of the testbed's /24: host i is PREFIX.(i+1).
    pub subnet: [u8; 3],
}

impl TestbedSpec {
    /// `hosts` hosts named `name`-h*, on 10.77.0.0/24.
    pub fn new(name: impl Into<String>, hosts: usize) -> Self {
        TestbedSpec { name: name.into(), hosts, subnet: [10, 77, 0] }
    }

    fn check(&self) -> Result<()> {
        let ok = (1..=8).contains(&self.name.len())
            && self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            return Err(Error::Invalid(format!("testbed name {:?}: give 1..8 lowercase letters or digits", self.name)));
        }
        if !(1..=64).contains(&self.hosts) {
            return Err(Error::Invalid(format!("{} hosts: give 1..64", self.hosts)));
        }
        let private = match self.subnet {
            [10, _, _] => true,
            [172, b, _] => (16..=31).contains(&b),
            [192, 168, _] => true,
            _ => false,
        };
        if !private {
            return Err(Error::Invalid(format!(
                "subnet {}.{}.{}.0/24 is not private (RFC 1918): a testbed uses only addresses of its own",
                self.subnet[0], self.subnet[1], self.subnet[2]
            )));
        }
        Ok(())
    }

    /// The switch namespace.
    pub fn switch(&self) -> String {
        format!("{}-sw", self.name)
    }

    /// Host `i`'s name: its namespace's name and the host name processes in it see.
    pub fn host(&self, i: usize) -> String {
        format!("{}-h{i}", self.name)
    }

    /// Host `i`'s address.
    pub fn address(&self, i: usize) -> String {
        let [a, b, c] = self.subnet;
        format!("{a}.{b}.{c}.{}", i + 1)
    }

    /// Host `i`'s device on the switch.
    fn port(i: usize) -> String {
        format!("h{i}")
    }
}

/// What `pagewise testbed status` and `exec` read about a testbed that is up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedState {
    pub spec: TestbedSpec,
    /// The profile its links are shaped to now.
    pub profile: String,
    /// The process holding the testbed (its guard removes it when that process ends).
    pub holder_pid: u32,
    /// Host names and addresses, in order.
    pub hosts: Vec<(String, String)>,
}

impl TestbedState {
    fn path(name: &str) -> PathBuf {
        PathBuf::from(STATE_DIR).join(format!("{name}.json"))
    }

    /// The state of testbed `name`, if it is up.
    pub fn load(name: &str) -> Result<Option<Self>> {
        let path = Self::path(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::parse(path.display().to_string(), e.to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Read { path, source }),
        }
    }

    /// Every testbed that is up.
    pub fn all() -> Result<Vec<Self>> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(STATE_DIR) else { return Ok(out) };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(".json") {
                out.extend(Self::load(stem)?);
            }
        }
        out.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        Ok(out)
    }

    /// The testbed that has host `host`, and the host's index.
    pub fn find_host(host: &str) -> Result<Option<(Self, usize)>> {
        for s in Self::all()? {
            if let Some(i) = s.hosts.iter().position(|(h, _)| h == host) {
                return Ok(Some((s, i)));
            }
        }
        Ok(None)
    }

    fn write(&self) -> Result<()> {
        std::fs::create_dir_all(STATE_DIR).map_err(|source| Error::Write {
            path: STATE_DIR.into(),
            value: "mkdir".into(),
            source,
        })?;
        let path = Self::path(&self.spec.name);
        let text = serde_json::to_string_pretty(self).expect("plain data serializes");
        std::fs::write(&path, text).map_err(|source| Error::Write { path, value: "testbed state".into(), source })
    }
}

/// A testbed that is up; dropping it takes it down.
pub struct Testbed {
    spec: TestbedSpec,
    profile: &'static NetProfile,
    // Last: dropped after everything else, removing what was made.
    guard: SettingsGuard,
}

impl Testbed {
    /// Make the namespaces, the switch and the links, shape the links to `profile`, and
    /// describe the testbed in STATE_DIR. Fails (having removed what it made) when any step
    /// fails or a testbed of that name is up.
    pub fn up(spec: TestbedSpec, profile: &'static NetProfile) -> Result<Self> {
        spec.check()?;
        if TestbedState::load(&spec.name)?.is_some() || netns::exists(&spec.switch()) {
            return Err(Error::Invalid(format!("a testbed named {} is up already (pagewise testbed down)", spec.name)));
        }
        let guard = SettingsGuard::new();
        let sw = spec.switch();
        netns::add(&guard, &sw)?;
        netns::add_bridge(&guard, &sw, BRIDGE)?;
        netns::set_mtu(&sw, BRIDGE, MTU)?;
        netns::set_up(&sw, BRIDGE)?;
        for i in 0..spec.hosts {
            let host = spec.host(i);
            let port = TestbedSpec::port(i);
            netns::add(&guard, &host)?;
            netns::add_veth(&guard, &sw, &port, &host, HOST_DEVICE)?;
            netns::set_master(&sw, &port, BRIDGE)?;
            netns::set_mtu(&sw, &port, MTU)?;
            netns::set_mtu(&host, HOST_DEVICE, MTU)?;
            netns::set_up(&sw, &port)?;
            netns::set_up(&host, HOST_DEVICE)?;
            netns::set_up(&host, "lo")?;
            netns::add_address(&host, HOST_DEVICE, &format!("{}/24", spec.address(i)))?;
        }
        let mut bed = Testbed { spec, profile, guard };
        bed.shape(profile)?;
        // Recorded before it is written, so a failure between the two leaves nothing.
        bed.guard.push(Undo::RemoveFile { path: TestbedState::path(&bed.spec.name) });
        bed.write_state()?;
        Ok(bed)
    }

    /// Shape every link to `profile` (both ends), replacing the shaping it had.
    pub fn shape(&mut self, profile: &'static NetProfile) -> Result<()> {
        let sw = self.spec.switch();
        for i in 0..self.spec.hosts {
            let host = self.spec.host(i);
            let port = TestbedSpec::port(i);
            match profile.token_bucket() {
                Some(bucket) => {
                    netns::set_rate(&self.guard, &host, HOST_DEVICE, &bucket)?;
                    netns::set_rate(&self.guard, &sw, &port, &bucket)?;
                }
                None => {
                    netns::delete_root_qdisc(&host, HOST_DEVICE)?;
                    netns::delete_root_qdisc(&sw, &port)?;
                }
            }
        }
        self.profile = profile;
        if TestbedState::load(&self.spec.name)?.is_some() {
            self.write_state()?;
        }
        Ok(())
    }

    fn write_state(&self) -> Result<()> {
        TestbedState {
            spec: self.spec.clone(),
            profile: self.profile.name.to_string(),
            holder_pid: std::process::id(),
            hosts: (0..self.spec.hosts).map(|i| (self.spec.host(i), self.spec.address(i))).collect(),
        }
        .write()
    }

    pub fn spec(&self) -> &TestbedSpec {
        &self.spec
    }

    pub fn profile(&self) -> &'static NetProfile {
        self.profile
    }

    /// Host `i`'s name (its namespace).
    pub fn host(&self, i: usize) -> String {
        self.spec.host(i)
    }

    /// Host `i`'s address.
    pub fn address(&self, i: usize) -> String {
        self.spec.address(i)
    }

    /// `tc -s qdisc show` of both ends of host `i`'s link.
    pub fn link_qdiscs(&self, i: usize) -> Result<String> {
        Ok(format!(
            "{} {HOST_DEVICE}: {}{} {}: {}",
            self.spec.host(i),
            netns::qdisc_show(&self.spec.host(i), HOST_DEVICE)?,
            self.spec.switch(),
            TestbedSpec::port(i),
            netns::qdisc_show(&self.spec.switch(), &TestbedSpec::port(i))?
        ))
    }

    /// Take the testbed down now; returns what could not be removed.
    pub fn down(self) -> Vec<Error> {
        self.guard.restore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_known_by_name_and_shape_both_ways() {
        assert_eq!(profile("25gbe").unwrap().rate_bytes_per_s, Some(3_125_000_000));
        assert!(profile("unshaped").unwrap().token_bucket().is_none());
        let e = profile("10base-t").unwrap_err().to_string();
        assert!(e.contains("myrinet-10g-x2") && e.contains("100gbe"), "{e}");
        let b = profile("100gbe").unwrap().token_bucket().unwrap();
        assert_eq!(b.burst_bytes, 250_000);
        assert_eq!(profile("myrinet-10g-x2").unwrap().token_bucket().unwrap().burst_bytes, 65536);
    }

    #[test]
    fn specs_name_hosts_and_addresses_and_refuse_public_subnets() {
        let s = TestbedSpec::new("pwtb", 4);
        s.check().unwrap();
        assert_eq!((s.host(3), s.address(3), s.switch()), ("pwtb-h3".into(), "10.77.0.4".into(), "pwtb-sw".into()));
        assert!(TestbedSpec { subnet: [8, 8, 8], ..s.clone() }.check().is_err());
        assert!(TestbedSpec { subnet: [172, 32, 0], ..s.clone() }.check().is_err());
        assert!(TestbedSpec { subnet: [192, 168, 9], ..s.clone() }.check().is_ok());
        assert!(TestbedSpec::new("Bad_Name", 2).check().is_err());
        assert!(TestbedSpec::new("toolongname", 2).check().is_err());
        assert!(TestbedSpec::new("pw", 0).check().is_err());
    }
}
