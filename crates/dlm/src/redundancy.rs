//! Redundancy of units across memory servers (issue 24 item 3), the pure part: what a run asks
//! for (`none`, `ec:K+M`, `copies:N`), where each piece of each block lives, which pieces a read
//! takes, where a lost server's pieces are rebuilt, and the Reed–Solomon code itself
//! ([`Codec`], `reed-solomon-erasure`). No I/O; the mechanism is `runtime/redundant.rs`, a
//! transport that stands for all the servers together.
//!
//! # Pieces
//! Erasure coding (`ec:K+M`, as Hydra, FAST '22): each base page's bytes are cut into K data
//! pieces of B/K bytes, and M parity pieces are computed from them. Piece i of a *unit* is the
//! concatenation of piece i of each of its pages, so a unit of any set count is, on every
//! server, one contiguous range of granules of B/K bytes — the same range whatever set count
//! wrote it, which the tuner changes at run time. Reed–Solomon works byte position by byte
//! position, so coding a unit's concatenated pieces at once gives the same bytes as coding each
//! page on its own. A read takes any K of the K+M pieces: normally the K data pieces, which are
//! the bytes themselves (no decoding); with a server lost, parity pieces stand in and the
//! missing data is decoded. K is a power of two, so a page splits evenly.
//!
//! Copies (`copies:N`): N full copies (pieces of B bytes); a read takes one.
//!
//! # Placement
//! An allocation is striped in blocks of `max_set` pages, as without redundancy (`layout.rs`).
//! Piece i of block b lives on server `live[(b + i) mod n]`, so the K+M pieces of a block are
//! on K+M different servers and the load rotates over all n. Each server's region holds the
//! pieces it got, in block order ([`Placement::new`]). A server that is lost has its pieces
//! rebuilt onto live servers holding no piece of the same block ([`rebuild_target`],
//! [`rebuild_targets`]): with n ≥ K+M+1 servers there always is one; with n = K+M there is
//! none, and the run goes on without the lost pieces (surviving M−1 more losses, not M).

use reed_solomon_erasure::galois_8::ReedSolomon;

/// Most pieces a block has (K+M or N). Bounded so that every decoding matrix fits the codec's
/// cache ([`Codec::new`]) and piece arrays live on the stack.
pub const MAX_PIECES: usize = 12;

/// Smallest piece of a page (B/K): the servers' smallest granule (PROTOCOL.md, ALLOC).
pub const MIN_PIECE: usize = crate::proto::MIN_GRANULE as usize;

/// Decoding matrices `reed-solomon-erasure` keeps (its `DATA_DECODE_MATRIX_CACHE_CAPACITY`):
/// every choice of M absent pieces must fit, so that decoding never allocates.
const DECODE_CACHE: u64 = 254;

/// How a run stores its units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Redundancy {
    /// One copy on one server: a lost server ends the program.
    #[default]
    None,
    /// Reed–Solomon: `data` pieces of B/K bytes per page plus `parity` pieces.
    Erasure { data: usize, parity: usize },
    /// `n` full copies.
    Copies(usize),
}

impl Redundancy {
    /// `none`, `ec:K+M` or `copies:N`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let num = |t: &str, what: &str| -> Result<usize, String> {
            t.trim().parse::<usize>().map_err(|_| format!("redundancy {s:?}: {what} {t:?} is not a number"))
        };
        let r = if s == "none" {
            Redundancy::None
        } else if let Some(rest) = s.strip_prefix("ec:") {
            let (k, m) = rest.split_once('+').ok_or_else(|| format!("redundancy {s:?}: write ec:K+M, e.g. ec:2+1"))?;
            Redundancy::Erasure { data: num(k, "K")?, parity: num(m, "M")? }
        } else if let Some(n) = s.strip_prefix("copies:") {
            Redundancy::Copies(num(n, "N")?)
        } else {
            return Err(format!("redundancy {s:?}: give none, ec:K+M (e.g. ec:2+1) or copies:N (e.g. copies:2)"));
        };
        r.check_shape()?;
        Ok(r)
    }

    /// Whether K, M, N make sense on their own.
    fn check_shape(&self) -> Result<(), String> {
        match *self {
            Redundancy::None => Ok(()),
            Redundancy::Erasure { data, parity } => {
                if data < 2 || !data.is_power_of_two() {
                    return Err(format!(
                        "ec:{data}+{parity}: K must be a power of two ≥ 2 (a page splits into K equal pieces; \
                         for whole copies use copies:N)"
                    ));
                }
                if parity == 0 {
                    return Err(format!("ec:{data}+0 stores no parity: give M ≥ 1 (or none)"));
                }
                if data + parity > MAX_PIECES || binomial(data + parity, parity) > DECODE_CACHE {
                    return Err(format!(
                        "ec:{data}+{parity}: at most {MAX_PIECES} pieces, and at most {DECODE_CACHE} ways to choose \
                         M of them (e.g. ec:8+2, ec:4+4)"
                    ));
                }
                Ok(())
            }
            Redundancy::Copies(n) => {
                if !(2..=MAX_PIECES).contains(&n) {
                    return Err(format!("copies:{n}: give 2..={MAX_PIECES} copies (copies:1 is none)"));
                }
                Ok(())
            }
        }
    }

    /// Whether units are stored more than once.
    pub fn is_redundant(&self) -> bool {
        *self != Redundancy::None
    }

    /// Pieces per page (K+M, N, 1).
    pub fn pieces(&self) -> usize {
        match *self {
            Redundancy::None => 1,
            Redundancy::Erasure { data, parity } => data + parity,
            Redundancy::Copies(n) => n,
        }
    }

    /// Pieces a read needs (K, 1, 1).
    pub fn needed(&self) -> usize {
        match *self {
            Redundancy::Erasure { data, .. } => data,
            _ => 1,
        }
    }

    /// Servers that may be lost at once (M, N−1, 0).
    pub fn tolerated(&self) -> usize {
        self.pieces() - self.needed()
    }

    /// Bytes of one page's piece for base pages of `base` bytes.
    pub fn piece_bytes(&self, base: usize) -> usize {
        base / self.needed()
    }

    /// Bytes stored per byte of data ((K+M)/K, N, 1).
    pub fn overhead(&self) -> f64 {
        self.pieces() as f64 / self.needed() as f64
    }

    /// Check against the run: base pages of `base` bytes, `servers` memory servers.
    pub fn check(&self, base: usize, servers: usize) -> Result<(), String> {
        self.check_shape()?;
        if *self == Redundancy::None {
            return Ok(());
        }
        if servers < self.pieces() {
            return Err(format!(
                "redundancy {self} puts the {} pieces of a unit on different memory servers: it needs at least {} \
                 servers, {servers} given",
                self.pieces(),
                self.pieces()
            ));
        }
        if self.piece_bytes(base) < MIN_PIECE {
            return Err(format!("redundancy {self}: pieces of {} bytes are below {MIN_PIECE}", self.piece_bytes(base)));
        }
        Ok(())
    }
}

impl std::fmt::Display for Redundancy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Redundancy::None => write!(f, "none"),
            Redundancy::Erasure { data, parity } => write!(f, "ec:{data}+{parity}"),
            Redundancy::Copies(n) => write!(f, "copies:{n}"),
        }
    }
}

fn binomial(n: usize, k: usize) -> u64 {
    (0..k as u64).fold(1u64, |acc, i| acc * (n as u64 - i) / (i + 1))
}

/// Where one piece of one block lives: a server, and the block's place in one of that server's
/// regions (in blocks of `max_set` granules).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Home {
    pub server: u16,
    /// The region on that server (its id from ALLOC; 0 until the mechanism knows it): the one
    /// made with the area, or one made by a rebuild.
    pub region: u32,
    /// The block's index inside that region.
    pub index: u32,
}

/// The homes of every piece of every block of one allocation, block-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub pieces: usize,
    pub homes: Vec<Home>,
    /// Blocks in each server's first region (indexed by server id).
    pub region_blocks: Vec<usize>,
}

impl Placement {
    /// `blocks` blocks of `pieces` pieces each over the live servers `live` (ids below
    /// `servers`): piece i of block b on `live[(b + i) mod n]`, regions in block order.
    pub fn new(blocks: usize, pieces: usize, live: &[usize], servers: usize) -> Self {
        assert!(pieces <= live.len(), "each piece of a block on a different server");
        let n = live.len();
        let mut region_blocks = vec![0usize; servers];
        let mut homes = Vec::with_capacity(blocks * pieces);
        for b in 0..blocks {
            for i in 0..pieces {
                let s = live[(b + i) % n];
                homes.push(Home { server: s as u16, region: 0, index: region_blocks[s] as u32 });
                region_blocks[s] += 1;
            }
        }
        Placement { pieces, homes, region_blocks }
    }

    /// The homes of block `b`'s pieces.
    pub fn block(&self, b: usize) -> &[Home] {
        &self.homes[b * self.pieces..(b + 1) * self.pieces]
    }
}

/// The pieces a read of a block takes, written into `out` (piece indices, rising): the first
/// `needed` pieces whose servers are not `lost` — the data pieces when their servers live (no
/// decoding). None when fewer than `needed` are left.
pub fn pieces_to_read(homes: &[Home], needed: usize, lost: impl Fn(usize) -> bool, out: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    for (i, h) in homes.iter().enumerate() {
        if n == needed {
            break;
        }
        if !lost(h.server as usize) {
            out[n] = i as u8;
            n += 1;
        }
    }
    (n == needed).then_some(n)
}

/// The server a lost piece of a block with pieces at `homes` is rebuilt onto: a live server
/// (`live(s)`, ids below `load.len()`) holding no piece of the block, the least loaded so far
/// by `load` (ties: the lowest id), so a lost server's pieces spread over the others. None
/// when every live server already holds a piece of the block. Allocates nothing (it runs
/// when a server is lost, possibly in the fault path).
pub fn rebuild_target(homes: &[Home], live: impl Fn(usize) -> bool, load: &[usize]) -> Option<usize> {
    (0..load.len()).filter(|&s| live(s) && !homes.iter().any(|h| h.server as usize == s)).min_by_key(|&s| (load[s], s))
}

/// One piece to rebuild: block, piece index, and the live server to put it on (None: every
/// live server already holds a piece of that block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebuild {
    pub block: usize,
    pub piece: usize,
    pub target: Option<usize>,
}

/// For every piece of `placement` whose home is not `live`: where [`rebuild_target`] puts it,
/// counting the pieces already planned in the load. The mechanism plans the same way, one
/// piece at a time.
pub fn rebuild_targets(placement: &Placement, live: impl Fn(usize) -> bool, servers: usize) -> Vec<Rebuild> {
    let mut load = vec![0usize; servers];
    let mut plan = Vec::new();
    let blocks = placement.homes.len() / placement.pieces.max(1);
    for b in 0..blocks {
        let homes = placement.block(b);
        for (i, h) in homes.iter().enumerate() {
            if live(h.server as usize) {
                continue;
            }
            let target = rebuild_target(homes, &live, &load);
            if let Some(t) = target {
                load[t] += 1;
            }
            plan.push(Rebuild { block: b, piece: i, target });
        }
    }
    plan
}

/// Cut `count` pages of `k` × `g` bytes (`src`) into `k` data pieces laid out one after the
/// other in `out` (each `count` × `g` bytes: piece i of every page in turn), as they are
/// stored: piece i of a unit is one contiguous range on its server.
pub fn split_pieces(src: &[u8], out: &mut [u8], k: usize, g: usize, count: usize) {
    let stride = count * g;
    for j in 0..count {
        for i in 0..k {
            out[i * stride + j * g..][..g].copy_from_slice(&src[(j * k + i) * g..][..g]);
        }
    }
}

/// The inverse of [`split_pieces`]: `k` data pieces (`pieces`, one after the other) back into
/// `count` pages in `dst`.
pub fn join_pieces(pieces: &[u8], dst: &mut [u8], k: usize, g: usize, count: usize) {
    let stride = count * g;
    for j in 0..count {
        for i in 0..k {
            dst[(j * k + i) * g..][..g].copy_from_slice(&pieces[i * stride + j * g..][..g]);
        }
    }
}

/// The Reed–Solomon code of `ec:K+M` over pieces laid out one after the other in a buffer.
/// Neither coding nor decoding allocates (the fault path may run in a signal handler): every
/// decoding matrix is computed when the codec is made.
pub struct Codec {
    rs: ReedSolomon,
    data: usize,
    parity: usize,
}

impl Codec {
    pub fn new(data: usize, parity: usize) -> Result<Self, String> {
        let rs = ReedSolomon::new(data, parity).map_err(|e| format!("ec:{data}+{parity}: {e:?}"))?;
        let codec = Codec { rs, data, parity };
        // Decode once for every choice of absent pieces: the library caches the matrices
        // (an LRU of 254, which `check_shape` keeps every choice within), so later decodes
        // find them there instead of inverting — and allocating.
        let total = data + parity;
        let mut buf = vec![0u8; total * 64];
        for mask in 0u32..(1 << total) {
            if mask.count_ones() as usize == data {
                codec.reconstruct(&mut buf, 64, mask, false)?;
            }
        }
        Ok(codec)
    }

    /// Compute the parity pieces of `buf` (K+M pieces of `len` bytes, one after the other)
    /// from its data pieces.
    pub fn encode(&self, buf: &mut [u8], len: usize) {
        let total = self.data + self.parity;
        let mut shards: [&mut [u8]; MAX_PIECES] = Default::default();
        for (s, chunk) in shards.iter_mut().zip(buf[..total * len].chunks_mut(len)) {
            *s = chunk;
        }
        self.rs.encode(&mut shards[..total]).expect("K+M pieces of equal length");
    }

    /// Decode the pieces of `buf` (K+M pieces of `len` bytes) absent from `present` (bit i:
    /// piece i is there; exactly K bits) from those present: the data pieces, and the parity
    /// pieces too when `all`.
    pub fn reconstruct(&self, buf: &mut [u8], len: usize, present: u32, all: bool) -> Result<(), String> {
        let total = self.data + self.parity;
        if present.count_ones() as usize != self.data || present >> total != 0 {
            return Err(format!("decoding needs exactly {} present pieces, got mask {present:#b}", self.data));
        }
        let mut shards: [(&mut [u8], bool); MAX_PIECES] = Default::default();
        for (i, (s, chunk)) in shards.iter_mut().zip(buf[..total * len].chunks_mut(len)).enumerate() {
            *s = (chunk, present & (1 << i) != 0);
        }
        let r = if all {
            self.rs.reconstruct(&mut shards[..total])
        } else {
            self.rs.reconstruct_data(&mut shards[..total])
        };
        r.map_err(|e| format!("Reed-Solomon decoding failed: {e:?}"))
    }

    pub fn data(&self) -> usize {
        self.data
    }

    pub fn parity(&self) -> usize {
        self.parity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_refuses_clearly() {
        assert_eq!(Redundancy::parse("none").unwrap(), Redundancy::None);
        assert_eq!(Redundancy::parse("ec:2+1").unwrap(), Redundancy::Erasure { data: 2, parity: 1 });
        assert_eq!(Redundancy::parse(" ec:8+2 ").unwrap(), Redundancy::Erasure { data: 8, parity: 2 });
        assert_eq!(Redundancy::parse("copies:2").unwrap(), Redundancy::Copies(2));
        for bad in ["", "ec", "ec:2", "ec:3+1", "ec:2+0", "ec:1+1", "ec:8+8", "copies:1", "copies:x", "raid5"] {
            assert!(Redundancy::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(Redundancy::parse("ec:3+1").unwrap_err().contains("power of two"));
        assert_eq!(Redundancy::parse("ec:4+2").unwrap().to_string(), "ec:4+2");
        assert_eq!(Redundancy::parse("ec:2+1").unwrap().overhead(), 1.5);
        assert_eq!(Redundancy::parse("copies:3").unwrap().overhead(), 3.0);
        let ec = Redundancy::parse("ec:2+1").unwrap();
        assert!(ec.check(4096, 3).is_ok());
        assert!(ec.check(4096, 2).unwrap_err().contains("at least 3"));
        assert!(Redundancy::parse("ec:8+2").unwrap().check(1024, 10).is_err(), "pieces below 256 bytes");
        assert_eq!((ec.pieces(), ec.needed(), ec.tolerated(), ec.piece_bytes(4096)), (3, 2, 1, 2048));
    }

    proptest! {
        /// Each block's pieces are on different live servers; each server's region indices
        /// are 0..its block count, each once.
        #[test]
        fn placement_spreads_pieces_and_packs_regions(blocks in 1usize..60, servers in 1usize..8, pieces in 1usize..6, dead in 0usize..8) {
            let live: Vec<usize> = (0..servers).filter(|&s| s != dead).collect();
            prop_assume!(pieces <= live.len());
            let p = Placement::new(blocks, pieces, &live, servers);
            for b in 0..blocks {
                let mut seen = std::collections::HashSet::new();
                for h in p.block(b) {
                    prop_assert!(live.contains(&(h.server as usize)));
                    prop_assert!(seen.insert(h.server));
                }
            }
            for s in 0..servers {
                let mut idx: Vec<u32> = p.homes.iter().filter(|h| h.server as usize == s).map(|h| h.index).collect();
                idx.sort();
                prop_assert_eq!(idx, (0..p.region_blocks[s] as u32).collect::<Vec<_>>());
            }
            prop_assert_eq!(p.region_blocks.iter().sum::<usize>(), blocks * pieces);
        }

        /// A lost server's pieces go to live servers holding nothing of the block, evenly.
        #[test]
        fn rebuild_targets_keep_pieces_apart(blocks in 1usize..80, servers in 3usize..8, pieces in 2usize..4, lost in 0usize..8) {
            prop_assume!(pieces < servers && lost < servers);
            let all: Vec<usize> = (0..servers).collect();
            let p = Placement::new(blocks, pieces, &all, servers);
            let plan = rebuild_targets(&p, |s| s != lost, servers);
            prop_assert_eq!(plan.len(), p.region_blocks[lost]);
            let mut load = vec![0usize; servers];
            for r in &plan {
                let t = r.target.expect("n > K+M: a server without a piece of the block");
                prop_assert!(t != lost);
                prop_assert!(p.block(r.block).iter().all(|h| h.server as usize != t));
                prop_assert_eq!(p.block(r.block)[r.piece].server as usize, lost);
                load[t] += 1;
            }
            let used: Vec<usize> = load.iter().copied().filter(|&l| l > 0).collect();
            prop_assert!(used.iter().max().unwrap_or(&0) - used.iter().min().unwrap_or(&0) <= plan.len().div_ceil(2));
        }

        /// Encoded, any K pieces give back the data, byte for byte.
        #[test]
        fn any_k_pieces_decode(k_shift in 1u32..4, m in 1usize..4, len in 1usize..40, seed: u64, pick: u32) {
            let k = 1usize << k_shift;
            prop_assume!(binomial(k + m, m) <= DECODE_CACHE);
            let total = k + m;
            let len = len * 2;
            let codec = Codec::new(k, m).unwrap();
            let mut buf = vec![0u8; total * len];
            let mut x = seed | 1;
            for b in buf[..k * len].iter_mut() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                *b = x as u8;
            }
            codec.encode(&mut buf, len);
            let original = buf.clone();
            // Keep K pieces chosen by `pick`.
            let mut present = 0u32;
            let mut order: Vec<usize> = (0..total).collect();
            order.rotate_left(pick as usize % total);
            for &i in order.iter().take(k) { present |= 1 << i; }
            for i in 0..total {
                if present & (1 << i) == 0 { buf[i * len..(i + 1) * len].fill(0xEE); }
            }
            codec.reconstruct(&mut buf, len, present, true).unwrap();
            prop_assert_eq!(&buf, &original);
        }
    }

    #[test]
    fn reads_prefer_data_pieces_and_fall_back_to_parity() {
        let all = [0usize, 1, 2, 3];
        let p = Placement::new(4, 3, &all, 4);
        let mut out = [0u8; MAX_PIECES];
        // Block 1: pieces on servers 1, 2, 3.
        assert_eq!(pieces_to_read(p.block(1), 2, |_| false, &mut out), Some(2));
        assert_eq!(&out[..2], &[0, 1]);
        assert_eq!(pieces_to_read(p.block(1), 2, |s| s == 2, &mut out), Some(2));
        assert_eq!(&out[..2], &[0, 2]);
        assert_eq!(pieces_to_read(p.block(1), 2, |s| s == 2 || s == 1, &mut out), None);
    }

    #[test]
    fn pieces_split_and_join_back() {
        let (k, g, count) = (4, 256, 3);
        let src: Vec<u8> = (0..k * g * count).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut pieces = vec![0u8; src.len()];
        split_pieces(&src, &mut pieces, k, g, count);
        // Piece 1 of page 2 lies at piece 1's range, third granule.
        assert_eq!(&pieces[count * g + 2 * g..][..g], &src[(2 * k + 1) * g..][..g]);
        let mut back = vec![0u8; src.len()];
        join_pieces(&pieces, &mut back, k, g, count);
        assert_eq!(back, src);
    }

    #[test]
    fn decoding_refuses_the_wrong_number_of_pieces() {
        let c = Codec::new(2, 1).unwrap();
        let mut buf = vec![0u8; 3 * 8];
        assert!(c.reconstruct(&mut buf, 8, 0b001, false).is_err());
        assert!(c.reconstruct(&mut buf, 8, 0b111, false).is_err());
        assert!(c.reconstruct(&mut buf, 8, 0b101, false).is_ok());
    }
}
