//! Many clients at once, every reply checked against a model of what the key must hold.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};

use common::Server;
use rand::{Rng, SeedableRng};

struct Conn {
    r: BufReader<std::net::TcpStream>,
    w: std::net::TcpStream,
}

impl Conn {
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).expect("read reply line");
        l
    }
    /// A get of one key: Some(value) or None.
    fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.w.write_all(format!("get {key}\r\n").as_bytes()).unwrap();
        let l = self.line();
        if l == "END\r\n" {
            return None;
        }
        let parts: Vec<&str> = l.trim_end().split(' ').collect();
        assert_eq!(parts[..2], ["VALUE", key], "reply {l:?}");
        let n: usize = parts[3].parse().unwrap();
        let mut v = vec![0; n + 2];
        self.r.read_exact(&mut v).unwrap();
        assert_eq!(&v[n..], b"\r\n");
        v.truncate(n);
        assert_eq!(self.line(), "END\r\n");
        Some(v)
    }
    fn cmd(&mut self, req: &[u8]) -> String {
        self.w.write_all(req).unwrap();
        self.line()
    }
}

/// A value that says what it is: key, version, and filler derived from both.
fn value(key: &str, version: u64, len: usize) -> Vec<u8> {
    let mut v = format!("{key}:{version}:").into_bytes();
    let seed = pagewise_kvcache::load::value_of(format!("{key}{version}").as_bytes(), len);
    v.extend_from_slice(&seed);
    v
}

fn self_consistent(key: &str, v: &[u8]) -> bool {
    let text = String::from_utf8_lossy(v);
    let mut it = text.splitn(3, ':');
    let (Some(k), Some(ver), Some(_)) = (it.next(), it.next(), it.next()) else { return false };
    let Ok(ver) = ver.parse::<u64>() else { return false };
    k == key && v.len() > k.len() + 2 && value(key, ver, v.len() - k.len() - ver.to_string().len() - 2) == v
}

#[test]
fn concurrent_clients_see_exactly_what_was_stored() {
    // 8000 keys of ~1 KB (two slab classes) in 4 MiB: stores must evict.
    concurrent_clients(&Server::start(&["-m", "4", "-t", "4"]));
}

/// The same on a server confined to one CPU, whose idle workers poll before they sleep.
#[test]
fn concurrent_clients_of_a_polling_server_see_exactly_what_was_stored() {
    let srv = Server::start_confined(&["-m", "4", "-t", "4"]);
    let cpus = pagewise_kernel::cpu::online_cpus().expect("online CPUs").len();
    assert_eq!(srv.setting_u64("poll_us"), if cpus > 1 { pagewise_kvcache::idle::DEFAULT_MAX_US } else { 0 });
    concurrent_clients(&srv);
}

fn concurrent_clients(srv: &Server) {
    let addr = srv.addr.clone();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let addr = addr.clone();
            s.spawn(move || {
                let stream = std::net::TcpStream::connect(&addr).unwrap();
                let mut c = Conn { r: BufReader::new(stream.try_clone().unwrap()), w: stream };
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
                let mut model: HashMap<String, (u64, Vec<u8>)> = HashMap::new();
                for op in 0..6000u64 {
                    let key = format!("t{t}k{}", rng.random_range(0..2000));
                    match rng.random_range(0..10) {
                        0..=3 => {
                            let v = value(&key, op, rng.random_range(880..1000));
                            let mut req = format!("set {key} {t} 0 {}\r\n", v.len()).into_bytes();
                            req.extend_from_slice(&v);
                            req.extend_from_slice(b"\r\n");
                            assert_eq!(c.cmd(&req), "STORED\r\n");
                            model.insert(key, (op, v));
                        }
                        4 => {
                            let r = c.cmd(format!("delete {key}\r\n").as_bytes());
                            assert!(r == "DELETED\r\n" || r == "NOT_FOUND\r\n", "{r}");
                            if r == "DELETED\r\n" {
                                assert!(model.contains_key(&key), "deleted a key never stored");
                            }
                            model.remove(&key);
                        }
                        _ => {
                            // Either the latest value or a miss (evicted), never anything else.
                            if let Some(v) = c.get(&key) {
                                let want = &model.get(&key).expect("a value for a key deleted or never stored").1;
                                assert!(v == *want, "{key}: wrong value");
                            }
                        }
                    }
                }
            });
        }
        // Readers of everybody's keys: every value read is whole and belongs to its key.
        for r in 0..2u64 {
            let addr = addr.clone();
            s.spawn(move || {
                let stream = std::net::TcpStream::connect(&addr).unwrap();
                let mut c = Conn { r: BufReader::new(stream.try_clone().unwrap()), w: stream };
                let mut rng = rand::rngs::SmallRng::seed_from_u64(100 + r);
                for _ in 0..6000 {
                    let key = format!("t{}k{}", rng.random_range(0..4), rng.random_range(0..2000));
                    if let Some(v) = c.get(&key) {
                        assert!(self_consistent(&key, &v), "{key}: torn or foreign value");
                    }
                }
            });
        }
    });
    assert!(srv.stat_u64("evictions") > 0, "the test should run under memory pressure");
}
