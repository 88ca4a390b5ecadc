//! A lean pipelined memcached load generator with YCSB's key choice: keys `user<fnv64(n)>`
//! (YCSB's hashed inserts), reads drawn from YCSB's ScrambledZipfianGenerator (zipfian
//! constant 0.99 over 10^10 items, folded onto the record count with FNV-1a), or uniformly
//! from a window of records (the drifting hot set). Values are derived from the key, so every
//! reply can be checked.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// YCSB's Utils.fnvhash64 (FNV-1a over the 8 bytes of the value, absolute value).
pub fn fnvhash64(mut val: u64) -> u64 {
    let mut h: i64 = 0xCBF2_9CE4_8422_2325u64 as i64;
    for _ in 0..8 {
        let octet = (val & 0xff) as i64;
        val >>= 8;
        h ^= octet;
        h = h.wrapping_mul(1_099_511_628_211);
    }
    h.unsigned_abs()
}

/// YCSB's key name of record `n` (CoreWorkload.buildKeyName, hashed inserts).
pub fn key_of(n: u64) -> String {
    format!("user{}", fnvhash64(n))
}

/// [`key_of`] appended to `out`, without allocating (the generator's hot path).
pub fn push_key(n: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(b"user");
    crate::cache::push_num(out, fnvhash64(n));
}

/// The value stored for `key`: `len` letters derived from the key.
pub fn value_of(key: &[u8], len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    push_value(key, len, &mut v);
    v
}

/// [`value_of`] appended to `out`. Eight letters per xorshift step, so that checking every
/// value read costs the generator little next to the server's work for the get.
pub fn push_value(key: &[u8], len: usize, out: &mut Vec<u8>) {
    let mut x = crate::cache::hash(key) | 1;
    let end = out.len() + len;
    while out.len() < end {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let take = (end - out.len()).min(8);
        out.extend(x.to_le_bytes()[..take].iter().map(|&b| b'a' + b % 26));
    }
}

/// A `VALUE key flags bytes` reply line's key and byte count.
fn parse_value_line(line: &[u8]) -> Option<(&[u8], usize)> {
    let line = line.strip_suffix(b"\r\n")?;
    let mut parts = line.split(|&c| c == b' ');
    if parts.next()? != b"VALUE" {
        return None;
    }
    let key = parts.next()?;
    let _flags = parts.next()?;
    let len = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    parts.next().is_none().then_some((key, len))
}

/// A small xorshift PRNG (per connection; deterministic seeds).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// YCSB's ScrambledZipfianGenerator over `[0, items)`.
pub struct ScrambledZipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

impl ScrambledZipfian {
    /// YCSB: ZipfianGenerator(0, 10^10, 0.99, zetan = 26.46902820178302) underneath.
    const ITEM_COUNT: f64 = 10_000_000_000.0;
    const ZETAN: f64 = 26.469_028_201_783_02;

    pub fn new(items: u64) -> Self {
        let theta = 0.99;
        let zeta2 = 1.0 + 0.5f64.powf(theta);
        let n = Self::ITEM_COUNT;
        ScrambledZipfian {
            items: items.max(1),
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan: Self::ZETAN,
            eta: (1.0 - (2.0 / n).powf(1.0 - theta)) / (1.0 - zeta2 / Self::ZETAN),
            half_pow_theta: 0.5f64.powf(theta),
        }
    }

    pub fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.next_f64();
        let uz = u * self.zetan;
        let z = if uz < 1.0 {
            0
        } else if uz < 1.0 + self.half_pow_theta {
            1
        } else {
            (Self::ITEM_COUNT * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64
        };
        let _ = self.theta;
        fnvhash64(z) % self.items
    }
}

/// How reads choose records.
#[derive(Clone, Copy, Debug)]
pub enum Choice {
    Zipfian,
    /// Uniform over `[start, start + len)`.
    Window {
        start: u64,
        len: u64,
    },
    /// Uniform over the records `n` with `n % stride == phase`: a hot set scattered thinly
    /// over the slab memory (one hot item every `stride` records), which HPS must compact
    /// rather than promote; a new phase is a new hot set (drift).
    Strided {
        stride: u64,
        phase: u64,
    },
}

impl Choice {
    fn pick(&self, zipf: &ScrambledZipfian, rng: &mut Rng, records: u64) -> u64 {
        match *self {
            Choice::Zipfian => zipf.next(rng),
            Choice::Window { start, len } => start + rng.next_u64() % len.max(1),
            Choice::Strided { stride, phase } => {
                let stride = stride.max(1);
                (rng.next_u64() % (records / stride).max(1)) * stride + phase % stride
            }
        }
    }
}

/// One load run's result.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadResult {
    pub ops: u64,
    pub hits: u64,
    pub misses: u64,
    /// Replies that were not what the protocol or the stored value says.
    pub bad: u64,
    pub secs: f64,
}

impl LoadResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
}

fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(s)
}

/// Store records `[first, first + count)` over `conns` connections, `depth` sets in flight.
pub fn load(
    addr: &str,
    first: u64,
    count: u64,
    value_len: usize,
    conns: usize,
    depth: usize,
) -> std::io::Result<LoadResult> {
    let t = Instant::now();
    let per = count.div_ceil(conns as u64);
    let results: Vec<std::io::Result<LoadResult>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..conns as u64)
            .map(|c| {
                let lo = first + c * per;
                let hi = (lo + per).min(first + count);
                s.spawn(move || -> std::io::Result<LoadResult> {
                    let stream = connect(addr)?;
                    let mut r = BufReader::new(stream.try_clone()?);
                    let mut w = stream;
                    let mut res = LoadResult::default();
                    let mut n = lo;
                    let mut line = String::new();
                    let mut buf = Vec::new();
                    let mut key = Vec::new();
                    let header_tail = format!(" 0 0 {value_len}\r\n");
                    while n < hi {
                        let batch = (hi - n).min(depth as u64);
                        buf.clear();
                        for i in n..n + batch {
                            key.clear();
                            push_key(i, &mut key);
                            buf.extend_from_slice(b"set ");
                            buf.extend_from_slice(&key);
                            buf.extend_from_slice(header_tail.as_bytes());
                            push_value(&key, value_len, &mut buf);
                            buf.extend_from_slice(b"\r\n");
                        }
                        w.write_all(&buf)?;
                        for _ in 0..batch {
                            line.clear();
                            r.read_line(&mut line)?;
                            if line != "STORED\r\n" {
                                res.bad += 1;
                            }
                            res.ops += 1;
                        }
                        n += batch;
                    }
                    Ok(res)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("load thread")).collect()
    });
    let mut total = LoadResult::default();
    for r in results {
        let r = r?;
        total.ops += r.ops;
        total.bad += r.bad;
    }
    total.secs = t.elapsed().as_secs_f64();
    Ok(total)
}

/// Read for `duration` (or `max_ops` gets, whichever first) over `conns` connections with
/// `depth` gets in flight each; every hit's value is checked when `verify`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    addr: &str,
    records: u64,
    choice: Choice,
    value_len: usize,
    conns: usize,
    depth: usize,
    max_ops: u64,
    duration: Duration,
    verify: bool,
    seed: u64,
) -> std::io::Result<LoadResult> {
    let t = Instant::now();
    let per = max_ops.div_ceil(conns as u64);
    let results: Vec<std::io::Result<LoadResult>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..conns as u64)
            .map(|c| {
                s.spawn(move || -> std::io::Result<LoadResult> {
                    let zipf = ScrambledZipfian::new(records);
                    let mut rng = Rng::new(seed ^ (c + 1).wrapping_mul(0x1234_5678_9abc));
                    let stream = connect(addr)?;
                    let mut r = BufReader::with_capacity(256 * 1024, stream.try_clone()?);
                    let mut w = stream;
                    let mut res = LoadResult::default();
                    // Reused buffers: the generator allocates nothing per get, so that it
                    // outruns the server it measures.
                    let mut keys: Vec<u8> = Vec::with_capacity(depth * 32);
                    let mut key_ends: Vec<usize> = Vec::with_capacity(depth);
                    let mut buf: Vec<u8> = Vec::with_capacity(depth * 40);
                    let mut line = Vec::new();
                    let mut data = Vec::new();
                    let mut expected = Vec::with_capacity(value_len);
                    let t0 = Instant::now();
                    while res.ops < per && t0.elapsed() < duration {
                        keys.clear();
                        key_ends.clear();
                        buf.clear();
                        for _ in 0..depth {
                            let n = choice.pick(&zipf, &mut rng, records);
                            let start = keys.len();
                            push_key(n, &mut keys);
                            key_ends.push(keys.len());
                            buf.extend_from_slice(b"get ");
                            buf.extend_from_slice(&keys[start..]);
                            buf.extend_from_slice(b"\r\n");
                        }
                        w.write_all(&buf)?;
                        for (i, &end) in key_ends.iter().enumerate() {
                            let k = &keys[if i == 0 { 0 } else { key_ends[i - 1] }..end];
                            line.clear();
                            r.read_until(b'\n', &mut line)?;
                            if line == b"END\r\n" {
                                res.misses += 1;
                                res.ops += 1;
                                continue;
                            }
                            let len = match parse_value_line(&line) {
                                Some((key, len)) if key == k => len,
                                _ => {
                                    return Err(std::io::Error::other(format!(
                                        "unexpected reply {:?} to get {}",
                                        String::from_utf8_lossy(&line),
                                        String::from_utf8_lossy(k)
                                    )))
                                }
                            };
                            data.resize(len + 2, 0);
                            r.read_exact(&mut data)?;
                            if verify {
                                expected.clear();
                                push_value(k, value_len, &mut expected);
                                if data[..len] != expected[..] {
                                    res.bad += 1;
                                }
                            }
                            line.clear();
                            r.read_until(b'\n', &mut line)?;
                            if line != b"END\r\n" {
                                res.bad += 1;
                            }
                            res.hits += 1;
                            res.ops += 1;
                        }
                    }
                    Ok(res)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("run thread")).collect()
    });
    let mut total = LoadResult::default();
    for r in results {
        let r = r?;
        total.ops += r.ops;
        total.hits += r.hits;
        total.misses += r.misses;
        total.bad += r.bad;
    }
    total.secs = t.elapsed().as_secs_f64();
    Ok(total)
}

/// Send `stats` and return its `STAT name value` pairs.
pub fn stats(addr: &str) -> std::io::Result<Vec<(String, String)>> {
    stats_of(addr, "")
}

/// `stats settings` of the server at `addr`, as name/value pairs.
pub fn settings(addr: &str) -> std::io::Result<Vec<(String, String)>> {
    stats_of(addr, " settings")
}

fn stats_of(addr: &str, kind: &str) -> std::io::Result<Vec<(String, String)>> {
    let stream = connect(addr)?;
    let mut r = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    w.write_all(format!("stats{kind}\r\n").as_bytes())?;
    let mut out = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("connection closed inside stats"));
        }
        let l = line.trim_end();
        if l == "END" {
            return Ok(out);
        }
        if let Some(rest) = l.strip_prefix("STAT ") {
            if let Some((k, v)) = rest.split_once(' ') {
                out.push((k.to_string(), v.to_string()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_ycsb() {
        // YCSB Utils.fnvhash64, computed independently with the Java code's signed arithmetic.
        assert_eq!(fnvhash64(0), 6284781860667377211);
        assert_eq!(fnvhash64(1), 8517097267634966620);
        assert_eq!(fnvhash64(12345), 1792800413050876852);
        assert_eq!(key_of(1), "user8517097267634966620");
    }

    #[test]
    fn push_key_writes_key_of() {
        let mut out = b"x".to_vec();
        for n in [0, 1, 9, 12345, u64::MAX] {
            out.truncate(1);
            push_key(n, &mut out);
            assert_eq!(&out[1..], key_of(n).as_bytes());
        }
    }

    #[test]
    fn values_are_letters_of_the_asked_length_and_depend_on_the_key() {
        for len in [0, 1, 7, 8, 9, 512] {
            let v = value_of(b"user1", len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(u8::is_ascii_lowercase));
            let mut appended = b"prefix".to_vec();
            push_value(b"user1", len, &mut appended);
            assert_eq!(&appended[6..], &v[..]);
        }
        assert_ne!(value_of(b"user1", 64), value_of(b"user2", 64));
    }

    #[test]
    fn value_lines_parse_exactly() {
        assert_eq!(parse_value_line(b"VALUE user7 0 512\r\n"), Some((&b"user7"[..], 512)));
        assert_eq!(parse_value_line(b"VALUE user7 0 512\n"), None);
        assert_eq!(parse_value_line(b"VALUE user7 0\r\n"), None);
        assert_eq!(parse_value_line(b"VALUE user7 0 512 9\r\n"), None);
        assert_eq!(parse_value_line(b"VALUE user7 0 x\r\n"), None);
        assert_eq!(parse_value_line(b"SERVER_ERROR out of memory\r\n"), None);
    }

    #[test]
    fn zipfian_is_skewed_and_in_range() {
        let z = ScrambledZipfian::new(100_000);
        let mut rng = Rng::new(1);
        let mut counts = std::collections::HashMap::new();
        for _ in 0..200_000 {
            let v = z.next(&mut rng);
            assert!(v < 100_000);
            *counts.entry(v).or_insert(0u32) += 1;
        }
        let mut c: Vec<u32> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        // The most popular record gets a few percent of all reads; most records get few.
        assert!(c[0] > 2000, "top count {}", c[0]);
        assert!(counts.len() < 100_000);
    }
}
