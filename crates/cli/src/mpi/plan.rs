//! The decisions of `pagewise mpi` that need no launcher and no network, as plain functions:
//! which launcher started this process and whether it agrees with PMIx, which address of a
//! memory server rank 0 tries first, and what the ranks publish.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The PMIx keys of a `pagewise mpi` job (versioned, so ranks of different builds fail to
/// find each other's keys instead of misreading them).
pub const KEY_START: &str = "pagewise.mpi.v1.start";
pub const KEY_SERVER: &str = "pagewise.mpi.v1.server";

/// Who started this process, from its environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    /// `mpirun (Open MPI)`, `srun (Slurm)`, or `a PMIx launcher`.
    pub name: &'static str,
    /// The rank and job size the launcher's own variables give, when it sets any
    /// (OMPI_COMM_WORLD_RANK/SIZE, SLURM_PROCID/SLURM_NTASKS).
    pub rank_size: Option<(u32, u32)>,
}

fn var_u32(env: &BTreeMap<String, String>, name: &str) -> Result<Option<u32>> {
    match env.get(name) {
        None => Ok(None),
        Some(v) => match v.trim().parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => bail!("{name}={v:?} is not a number"),
        },
    }
}

/// Which launcher started this process. PMIx is how every rank learns the others' addresses,
/// so a launcher without it (Slurm's srun without --mpi=pmix, or no launcher) is an error that
/// says what to run instead.
pub fn detect_launcher(env: &BTreeMap<String, String>) -> Result<Launcher> {
    let pmix = env.contains_key("PMIX_RANK") && env.contains_key("PMIX_NAMESPACE");
    let ompi = var_u32(env, "OMPI_COMM_WORLD_RANK")?.zip(var_u32(env, "OMPI_COMM_WORLD_SIZE")?);
    let slurm = var_u32(env, "SLURM_PROCID")?.zip(var_u32(env, "SLURM_NTASKS")?);
    if !pmix {
        if slurm.is_some() {
            bail!(
                "srun started this without PMIx: run `srun --mpi=pmix …` (`srun --mpi=list` shows what this Slurm \
                 offers; set MpiDefault=pmix in slurm.conf to make it the default)"
            );
        }
        bail!(
            "pagewise mpi runs as a rank of a parallel job and finds no launcher (no PMIX_RANK in its \
             environment): start it as `mpirun -np N pagewise mpi -- PROGRAM` or `srun -n N --mpi=pmix pagewise \
             mpi -- PROGRAM`; for one host, `pagewise run --spawn-servers N -- PROGRAM` does the same"
        );
    }
    Ok(match (ompi, slurm) {
        (Some(rs), _) => Launcher { name: "mpirun (Open MPI)", rank_size: Some(rs) },
        (None, Some(rs)) => Launcher { name: "srun (Slurm)", rank_size: Some(rs) },
        (None, None) => Launcher { name: "a PMIx launcher", rank_size: None },
    })
}

/// PMIx's rank and size must be the launcher's: a disagreement means this process reached
/// another job's PMIx server.
pub fn check_rank(launcher: &Launcher, rank: u32, size: u32) -> Result<()> {
    if let Some((r, s)) = launcher.rank_size {
        if (r, s) != (rank, size) {
            bail!("{} says rank {r} of {s}, its PMIx server says rank {rank} of {size}", launcher.name);
        }
    }
    if size < 2 {
        bail!("a job of {size} rank: pagewise mpi needs 2 or more (rank 0 runs the program, the others serve memory)");
    }
    Ok(())
}

/// Where a rank runs: machine (boot id) and network namespace. Two ranks with the same
/// identity share a network stack, so they talk over loopback.
pub fn same_network(a: &str, b: &str) -> bool {
    a == b
}

/// What rank 0 publishes at the start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Start {
    /// Rank 0's identity ([`same_network`]).
    pub identity: String,
    pub host: String,
    /// The job's secret, for its memory servers and its program (PAGEWISE_DLM_SECRET).
    pub secret: String,
}

/// What a memory server rank publishes once its server listens.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ServerInfo {
    pub host: String,
    /// Addresses to try, in order.
    pub addresses: Vec<Ipv4Addr>,
    /// The memory server's port.
    pub port: u16,
    /// The rank's control connection port (control.rs).
    pub control_port: u16,
    /// Bytes the server may hold.
    pub capacity: u64,
}

/// The address a memory server listens on, given where rank 0 runs: loopback when they share
/// a network; else the address of this host in `network` when one is given; else every
/// address (the server then lists all of its host's non-loopback addresses).
pub fn listen_address(
    same_as_rank0: bool,
    local: &[(Ipv4Addr, u8)],
    network: Option<(Ipv4Addr, u8)>,
) -> Result<Ipv4Addr> {
    if same_as_rank0 {
        return Ok(Ipv4Addr::LOCALHOST);
    }
    match network {
        Some((net, len)) => match local.iter().find(|(a, _)| in_network(*a, net, len)) {
            Some((a, _)) => Ok(*a),
            None => bail!(
                "this host has no address in --network {net}/{len} (it has {})",
                local.iter().map(|(a, l)| format!("{a}/{l}")).collect::<Vec<_>>().join(", ")
            ),
        },
        None => Ok(Ipv4Addr::UNSPECIFIED),
    }
}

/// The addresses a server listening on `bound` advertises.
pub fn advertised(bound: Ipv4Addr, local: &[(Ipv4Addr, u8)]) -> Vec<Ipv4Addr> {
    if !bound.is_unspecified() {
        return vec![bound];
    }
    local.iter().filter(|(a, _)| !a.is_loopback()).map(|(a, _)| *a).collect()
}

/// True when `addr` is in `net`/`len`.
pub fn in_network(addr: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len.min(32))) };
    u32::from(addr) & mask == u32::from(net) & mask
}

/// Parse `A.B.C.D/LEN`.
pub fn parse_network(s: &str) -> Result<(Ipv4Addr, u8)> {
    let Some((a, l)) = s.split_once('/') else { bail!("--network {s:?}: give ADDRESS/PREFIX, e.g. 10.77.0.0/24") };
    let addr: Ipv4Addr = a.parse().map_err(|_| anyhow::anyhow!("--network {s:?}: {a:?} is not an IPv4 address"))?;
    let len: u8 =
        l.parse().ok().filter(|&n| n <= 32).ok_or_else(|| anyhow::anyhow!("--network {s:?}: prefix 0..32"))?;
    Ok((addr, len))
}

/// A fresh secret: 32 random bytes in hex.
pub fn secret_from(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The environment of the program rank 0 runs: its own, less the launcher's variables. The
/// program is a sequential one; were it linked with MPI, PMIX_RANK and the like would make it
/// join this job as rank 0 of N, so it starts as a plain process (an MPI "singleton").
pub fn is_launcher_variable(name: &str) -> bool {
    ["PMIX_", "PMI_", "OMPI_", "ORTE_", "OPAL_"].iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn launchers_are_told_apart_and_a_missing_pmix_says_what_to_run() {
        let ompi = env(&[
            ("PMIX_RANK", "2"),
            ("PMIX_NAMESPACE", "123"),
            ("OMPI_COMM_WORLD_RANK", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ]);
        assert_eq!(detect_launcher(&ompi).unwrap(), Launcher { name: "mpirun (Open MPI)", rank_size: Some((2, 4)) });
        let slurm = env(&[
            ("PMIX_RANK", "1"),
            ("PMIX_NAMESPACE", "slurm.pmix.7.0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "3"),
        ]);
        assert_eq!(detect_launcher(&slurm).unwrap(), Launcher { name: "srun (Slurm)", rank_size: Some((1, 3)) });
        let bare = env(&[("PMIX_RANK", "0"), ("PMIX_NAMESPACE", "x")]);
        assert_eq!(detect_launcher(&bare).unwrap().rank_size, None);
        let e = detect_launcher(&env(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])).unwrap_err().to_string();
        assert!(e.contains("--mpi=pmix"), "{e}");
        let e = detect_launcher(&env(&[])).unwrap_err().to_string();
        assert!(e.contains("mpirun -np N pagewise mpi") && e.contains("srun -n N --mpi=pmix"), "{e}");
        assert!(
            detect_launcher(&env(&[("PMIX_RANK", "0"), ("PMIX_NAMESPACE", "x"), ("SLURM_PROCID", "zero")])).is_err()
        );
    }

    #[test]
    fn pmix_must_agree_with_the_launcher_and_a_job_needs_two_ranks() {
        let l = Launcher { name: "srun (Slurm)", rank_size: Some((1, 3)) };
        check_rank(&l, 1, 3).unwrap();
        assert!(check_rank(&l, 0, 3).is_err());
        let e = check_rank(&Launcher { name: "x", rank_size: None }, 0, 1).unwrap_err().to_string();
        assert!(e.contains("2 or more"), "{e}");
    }

    #[test]
    fn servers_listen_on_loopback_beside_rank_0_else_on_the_chosen_network() {
        let local = [(Ipv4Addr::LOCALHOST, 8), (Ipv4Addr::new(10, 77, 0, 2), 24), (Ipv4Addr::new(192, 0, 2, 2), 24)];
        assert_eq!(listen_address(true, &local, None).unwrap(), Ipv4Addr::LOCALHOST);
        assert_eq!(listen_address(false, &local, None).unwrap(), Ipv4Addr::UNSPECIFIED);
        let net = parse_network("10.77.0.0/24").unwrap();
        assert_eq!(listen_address(false, &local, Some(net)).unwrap(), Ipv4Addr::new(10, 77, 0, 2));
        let e = listen_address(false, &local, Some(parse_network("172.16.0.0/12").unwrap())).unwrap_err();
        assert!(e.to_string().contains("10.77.0.2/24"), "{e}");
        assert_eq!(
            advertised(Ipv4Addr::UNSPECIFIED, &local),
            vec![Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(192, 0, 2, 2)]
        );
        assert_eq!(advertised(Ipv4Addr::LOCALHOST, &local), vec![Ipv4Addr::LOCALHOST]);
    }

    #[test]
    fn networks_parse_and_contain() {
        assert!(in_network(Ipv4Addr::new(10, 77, 0, 9), Ipv4Addr::new(10, 77, 0, 0), 24));
        assert!(!in_network(Ipv4Addr::new(10, 77, 1, 9), Ipv4Addr::new(10, 77, 0, 0), 24));
        assert!(in_network(Ipv4Addr::new(1, 2, 3, 4), Ipv4Addr::UNSPECIFIED, 0));
        assert!(parse_network("10.0.0.0").is_err());
        assert!(parse_network("10.0.0.0/33").is_err());
        assert!(parse_network("ten/8").is_err());
    }

    #[test]
    fn the_program_starts_without_the_launcher_variables() {
        assert!(is_launcher_variable("PMIX_RANK") && is_launcher_variable("OMPI_COMM_WORLD_SIZE"));
        assert!(!is_launcher_variable("PATH") && !is_launcher_variable("SLURM_JOB_ID"));
        assert_eq!(secret_from(&[0xab; 32]).len(), 64);
    }
}
