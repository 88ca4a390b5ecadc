//! The batch programs: each constructor writes the job's inputs into `dir` and returns the
//! [`Job`]. Sizes are parameters so a test can run a small one and an experiment a large one.
//! Every program is a Debian package's binary (the Makefile's APT_PACKAGES), run as a user
//! would; the scripts they read (Python, Java, SQL) live in crates/eval/programs/.

use std::io::Write;
use std::path::Path;

use anyhow::Context as _;

use super::{Canon, Job};

const NUMPY_WORK: &str = include_str!("../../programs/numpy_work.py");
const HPS_GATHER: &str = include_str!("../../programs/hps_gather.py");
const NUMPY_FORK_POOL: &str = include_str!("../../programs/numpy_fork_pool.py");
const NUMPY_STREAM: &str = include_str!("../../programs/numpy_stream.py");
const HEAP_WORK: &str = include_str!("../../programs/HeapWork.java");

/// Debian's python3, which has python3-numpy; not whatever `python3` is first on PATH (a
/// pyenv interpreter has no numpy).
pub const DEBIAN_PYTHON: &str = "/usr/bin/python3";

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn job(name: &str, dir: &Path, argv: &[&str], canon: Canon) -> Job {
    Job {
        name: name.to_string(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        cwd: dir.to_path_buf(),
        canon,
    }
}

/// BLAS and OpenMP on one thread: the programs' arithmetic in one order in every run (and no
/// second core taken from the memory servers).
fn one_thread(j: &mut Job) {
    for k in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
        j.env.push((k.into(), "1".into()));
    }
}

/// A text file of about `bytes` bytes: lines of six words drawn from a vocabulary of 5,000
/// pseudo-random words (seeded), so that sort has many distinct keys and compressors find some
/// redundancy (xz compresses it about 3:1).
pub fn write_text(path: &Path, bytes: u64) -> anyhow::Result<()> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let words: Vec<Vec<u8>> = (0..5000)
        .map(|_| {
            let len = 3 + (next() % 10) as usize;
            (0..len).map(|_| b'a' + (next() % 16) as u8).collect()
        })
        .collect();
    let f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    let mut written = 0u64;
    while written < bytes {
        let mut line = Vec::with_capacity(80);
        for i in 0..6 {
            if i > 0 {
                line.push(b' ');
            }
            line.extend_from_slice(&words[(next() % words.len() as u64) as usize]);
        }
        line.push(b'\n');
        w.write_all(&line).with_context(|| format!("writing {}", path.display()))?;
        written += line.len() as u64;
    }
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// HPC Challenge, one rank (an MPI singleton: no mpirun), HPL of order `n` (its other tests
/// size themselves from the memory that implies), NB 80, a 1×1 grid. hpcc validates every
/// test itself (HPL's scaled residual, RandomAccess's error count, STREAM's and FFT's checks,
/// PTRANS's residuals); [`Canon::Hpcc`] keeps those verdicts.
pub fn hpcc(dir: &Path, n: usize) -> anyhow::Result<Job> {
    let inf = format!(
        "HPLinpack benchmark input file\n\
         Innovative Computing Laboratory, University of Tennessee\n\
         HPL.out      output file name (if any)\n\
         8            device out (6=stdout,7=stderr,file)\n\
         1            # of problems sizes (N)\n\
         {n}         Ns\n\
         1            # of NBs\n\
         80           NBs\n\
         0            PMAP process mapping (0=Row-,1=Column-major)\n\
         1            # of process grids (P x Q)\n\
         1            Ps\n\
         1            Qs\n\
         16.0         threshold\n\
         1            # of panel fact\n\
         2            PFACTs (0=left, 1=Crout, 2=Right)\n\
         1            # of recursive stopping criterium\n\
         4            NBMINs (>= 1)\n\
         1            # of panels in recursion\n\
         2            NDIVs\n\
         1            # of recursive panel fact.\n\
         1            RFACTs (0=left, 1=Crout, 2=Right)\n\
         1            # of broadcast\n\
         1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)\n\
         1            # of lookahead depth\n\
         1            DEPTHs (>=0)\n\
         2            SWAP (0=bin-exch,1=long,2=mix)\n\
         64           swapping threshold\n\
         0            L1 in (0=transposed,1=no-transposed) form\n\
         0            U  in (0=transposed,1=no-transposed) form\n\
         1            Equilibration (0=no,1=yes)\n\
         8            memory alignment in double (> 0)\n\
         ##### This line (no. 32) is ignored (it serves as a separator). ######\n\
         0                      \t\tNumber of additional problem sizes for PTRANS\n\
         1200 10000 30000        \tvalues of N\n\
         0                       \tnumber of additional blocking sizes for PTRANS\n\
         40 9 8 13 13 20 16 32 64       \tvalues of NB\n"
    );
    write(&dir.join("hpccinf.txt"), inf.as_bytes())?;
    let mut j = job("hpcc", dir, &["hpcc"], Canon::Hpcc);
    one_thread(&mut j);
    // Open MPI as an MPI singleton, run as root, on this host only (shared memory and self).
    for (k, v) in [
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ("OMPI_MCA_plm", "isolated"),
        ("OMPI_MCA_btl", "self,vader"),
        ("OMPI_MCA_btl_vader_single_copy_mechanism", "none"),
    ] {
        j.env.push((k.into(), v.into()));
    }
    Ok(j)
}

/// 7-Zip's built-in benchmark, one pass, one thread, dictionaries up to 2^`dict_log2` bytes
/// (LZMA's encoder takes about 11× the dictionary). It compresses and decompresses its own data
/// and checks the result; it runs for a time it picks, so its figure is its rating, not its
/// time ([`super::seven_zip_rating`]).
pub fn seven_zip_bench(dir: &Path, dict_log2: u32) -> Job {
    job("7zz-b", dir, &["7zz", "b", "1", "-mmt1", &format!("-md{dict_log2}")], Canon::SevenZipBench)
}

/// `xz -9` (one thread) of a generated text file of `bytes` into xz-input.txt.xz
/// ([`Canon::File`]); [`verify_round_trip`] with [`XZ_DECOMPRESS`] checks it.
pub fn xz(dir: &Path, bytes: u64) -> anyhow::Result<Job> {
    write_text(&dir.join("xz-input.txt"), bytes)?;
    Ok(job("xz", dir, &["xz", "-9", "-T1", "-k", "-f", "xz-input.txt"], Canon::File("xz-input.txt.xz")))
}

pub const XZ_DECOMPRESS: &[&str] = &["xz", "-dc"];
pub const ZSTD_DECOMPRESS: &[&str] = &["zstd", "-q", "-dc"];

/// Decompress `compressed` with `argv` (reading stdin) and compare with `original`.
pub fn verify_round_trip(argv: &[&str], compressed: &Path, original: &Path) -> anyhow::Result<()> {
    let input = std::fs::File::open(compressed).with_context(|| format!("opening {}", compressed.display()))?;
    let out = std::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdin(input)
        .output()
        .with_context(|| format!("running {argv:?}"))?;
    anyhow::ensure!(out.status.success(), "{argv:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let want = std::fs::read(original).with_context(|| format!("reading {}", original.display()))?;
    anyhow::ensure!(
        out.stdout == want,
        "{argv:?} of {} does not give {} back",
        compressed.display(),
        original.display()
    );
    Ok(())
}

/// zstd -12 (one thread) of a generated text file of `bytes` into out.zst ([`Canon::File`]).
pub fn zstd(dir: &Path, bytes: u64) -> anyhow::Result<Job> {
    write_text(&dir.join("zstd-input.txt"), bytes)?;
    Ok(job("zstd", dir, &["zstd", "-q", "-12", "-T1", "-f", "zstd-input.txt", "-o", "out.zst"], Canon::File("out.zst")))
}

/// 7-Zip (`7zz a`, LZMA2, a `dict_mib` dictionary, one thread) of a generated text file of
/// `bytes` into a.7z ([`Canon::File`]); `7zz t` checks archives.
pub fn seven_zip_archive(dir: &Path, bytes: u64, dict_mib: u64) -> anyhow::Result<Job> {
    write_text(&dir.join("7z-input.txt"), bytes)?;
    let md = format!("-md={dict_mib}m");
    Ok(job(
        "7zz",
        dir,
        &["7zz", "a", "-bd", "-t7z", "-m0=lzma2", "-mx=7", &md, "-mmt=1", "a.7z", "7z-input.txt"],
        Canon::File("a.7z"),
    ))
}

/// GNU sort of a generated text file of `bytes` with a `buffer`-byte buffer (`-S`: one
/// allocation of that size), one thread, byte order (LC_ALL=C).
pub fn sort(dir: &Path, bytes: u64, buffer: u64) -> anyhow::Result<Job> {
    write_text(&dir.join("sort-input.txt"), bytes)?;
    let mut j = job(
        "sort",
        dir,
        &["sort", "-S", &format!("{}K", buffer >> 10), "--parallel=1", "sort-input.txt"],
        Canon::Stdout,
    );
    j.env.push(("LC_ALL".into(), "C".into()));
    Ok(j)
}

/// Debian's python3 + numpy: FFT, matrix multiply and sort on `n` doubles
/// (crates/eval/programs/numpy_work.py).
pub fn numpy(dir: &Path, n: usize) -> anyhow::Result<Job> {
    write(&dir.join("numpy_work.py"), NUMPY_WORK.as_bytes())?;
    let mut j = job("numpy", dir, &[DEBIAN_PYTHON, "numpy_work.py", &n.to_string()], Canon::Stdout);
    one_thread(&mut j);
    Ok(j)
}

/// Debian's python3 + numpy sweeping arrays front to back: a generated file of `bytes` read
/// through np.memmap, copied, widened to 64 bits (8 × `bytes`), scaled, summed and counted
/// (crates/eval/programs/numpy_stream.py).
pub fn numpy_stream(dir: &Path, bytes: u64) -> anyhow::Result<Job> {
    write(&dir.join("numpy_stream.py"), NUMPY_STREAM.as_bytes())?;
    write_text(&dir.join("stream-input.txt"), bytes)?;
    let mut j = job("numpy-stream", dir, &[DEBIAN_PYTHON, "numpy_stream.py", "stream-input.txt"], Canon::Stdout);
    one_thread(&mut j);
    Ok(j)
}

/// Debian's python3 + numpy, a multiprocessing pool started by fork reading the parent's
/// array of `n` doubles (crates/eval/programs/numpy_fork_pool.py).
pub fn numpy_fork_pool(dir: &Path, n: usize) -> anyhow::Result<Job> {
    write(&dir.join("numpy_fork_pool.py"), NUMPY_FORK_POOL.as_bytes())?;
    let mut j = job("numpy-fork-pool", dir, &[DEBIAN_PYTHON, "numpy_fork_pool.py", &n.to_string()], Canon::Stdout);
    one_thread(&mut j);
    Ok(j)
}

/// The numpy pattern of issue 22 (crates/eval/programs/hps_gather.py): an array of `size_mib`,
/// `rounds` rounds of `gathers` random gathers inside its first `hot_mib`, each allocating and
/// freeing a temporary.
pub fn numpy_gather(dir: &Path, size_mib: u64, hot_mib: u64, rounds: u32, gathers: u64) -> anyhow::Result<Job> {
    write(&dir.join("hps_gather.py"), HPS_GATHER.as_bytes())?;
    let args = [size_mib.to_string(), hot_mib.to_string(), rounds.to_string(), gathers.to_string()];
    let mut j = job(
        "numpy-gather",
        dir,
        &[DEBIAN_PYTHON, "hps_gather.py", &args[0], &args[1], &args[2], &args[3]],
        Canon::Rounds,
    );
    one_thread(&mut j);
    Ok(j)
}

/// The round times hps_gather.py printed, in order.
pub fn round_times(stdout: &str) -> Vec<f64> {
    stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["round", _, s] => s.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

/// sqlite3 on an in-memory database: `rows` rows made by a recursive query, an index, joins
/// and aggregates, and a group_concat of every row (one string that grows by realloc to
/// several MB).
pub fn sqlite(dir: &Path, rows: u64) -> anyhow::Result<Job> {
    let sql = format!(
        "PRAGMA cache_size = -262144;\n\
         CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})\n\
         INSERT INTO t SELECT x, (x * 7919) % 1000, printf('value-%08d-%s', x * 31 % 99991, hex(x * x)) FROM c;\n\
         CREATE INDEX t_k ON t(k);\n\
         SELECT count(*), sum(k), max(v), min(v) FROM t;\n\
         SELECT k, count(*), sum(length(v)) FROM t GROUP BY k ORDER BY k LIMIT 5;\n\
         SELECT count(*) FROM t a JOIN t b ON a.k = b.k WHERE a.id < 200 AND b.id % 97 = 0;\n\
         SELECT length(group_concat(v, ',')), substr(group_concat(v, ','), 1000, 40) FROM (SELECT v FROM t ORDER BY v);\n"
    );
    write(&dir.join("work.sql"), sql.as_bytes())?;
    Ok(job("sqlite3", dir, &["sqlite3", ":memory:", ".read work.sql"], Canon::Stdout))
}

/// gcc's compiler (cc1 -O1) on one generated C file of `functions` functions (each a loop over
/// its own static array and a switch), writing big.s ([`Canon::File`]).
pub fn gcc(dir: &Path, functions: usize) -> anyhow::Result<Job> {
    let mut src = String::from("#include <stddef.h>\n");
    for i in 0..functions {
        src.push_str(&format!(
            "static double a{i}[{n}];\n\
             double f{i}(double x, size_t m) {{\n\
               double s = 0;\n\
               for (size_t j = 0; j < m && j < {n}; j++) {{ a{i}[j] = x * j + {i}; s += a{i}[j] * a{i}[(j * 7) % {n}]; }}\n\
               switch ((int)s % 5) {{ case 0: s += {i}; break; case 1: s *= 2; break; case 2: s -= x; break; default: s /= 3; }}\n\
               return s;\n\
             }}\n",
            n = 64 + i % 37
        ));
    }
    src.push_str("double all(double x) { double s = 0;\n");
    for i in 0..functions {
        src.push_str(&format!("  s += f{i}(x, {});\n", i % 50));
    }
    src.push_str("  return s; }\n");
    write(&dir.join("big.c"), src.as_bytes())?;
    // cc1, gcc's compiler proper, where the memory is (the gcc driver only forks it; the
    // shim's report covers the process `pagewise run` started).
    let out = std::process::Command::new("gcc").arg("-print-prog-name=cc1").output().context("running gcc")?;
    let cc1 = String::from_utf8_lossy(&out.stdout).trim().to_string();
    anyhow::ensure!(out.status.success() && Path::new(&cc1).is_file(), "gcc -print-prog-name=cc1 gave {cc1:?}");
    Ok(job("gcc", dir, &[&cc1, "-quiet", "-O1", "big.c", "-o", "big.s"], Canon::File("big.s")))
}

/// perl building a hash of `keys` keys and an array of their values, sorted, summed and joined.
pub fn perl(dir: &Path, keys: u64) -> Job {
    let script = format!(
        "my %h; for my $i (1..{keys}) {{ $h{{\"key$i\"}} = ($i * 7919) % 100003; }}\n\
         my @v = sort {{ $a <=> $b }} values %h; my $s = 0; $s += $_ for @v;\n\
         my $j = join(',', @v[0..99]); print scalar(@v), \" $s \", length(join(',', @v)), \" $j\\n\";"
    );
    job("perl", dir, &["perl", "-e", &script], Canon::Stdout)
}

/// A JVM (Debian's OpenJDK) with a fixed heap of `heap_mib` (serial GC), running
/// crates/eval/programs/HeapWork.java (source launch) on `data_mib` of long arrays for `rounds`
/// rounds. With `wait`, it reads a line of stdin before exiting.
pub fn java(dir: &Path, heap_mib: u64, data_mib: u64, rounds: u32, wait: bool) -> anyhow::Result<Job> {
    write(&dir.join("HeapWork.java"), HEAP_WORK.as_bytes())?;
    let heap = format!("-Xmx{heap_mib}m");
    let min = format!("-Xms{heap_mib}m");
    let (d, r) = (data_mib.to_string(), rounds.to_string());
    let mut argv =
        vec!["java", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Xshare:auto", &min, &heap, "HeapWork.java", &d, &r];
    if wait {
        argv.push("wait");
    }
    Ok(job("java", dir, &argv, Canon::Stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_text_is_deterministic_and_sized() {
        let dir = super::super::Scratch::new("text-test").unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write_text(&a, 100_000).unwrap();
        write_text(&b, 100_000).unwrap();
        let (x, y) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        assert_eq!(x, y);
        assert!(x.len() >= 100_000 && x.len() < 100_200);
        assert!(x.ends_with(b"\n") && x.iter().filter(|&&c| c == b'\n').count() > 1000);
    }

    #[test]
    fn gather_round_times_are_read() {
        assert_eq!(round_times("round 0 0.5\nround 1 0.25\nchecksum 3.0\n"), vec![0.5, 0.25]);
    }
}
