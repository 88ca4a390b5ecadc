//! The seed's `/proc/PID/page_acs` layout, and the file a tracker publishes for
//! `pagewise hps report --pid PID`.
//!
//! Layout (seed 000): for each VMA its `/proc/PID/maps` line, then one line per run of pages
//! with equal count, `start-end : 0xCOUNT` (`%08lx-%08lx : 0x%08x`).
//!
//! Publication: the tracker runs inside the tracked process, so another process cannot read its
//! counts from memory; after each decision step it writes
//! `/run/pagewise/hps/PID.acs` (rename over a temporary file, so readers never see half a file):
//! `range START END` lines (hex) each followed by its runs in the same `start-end : 0xCOUNT`
//! form. `pagewise hps report` joins those with the live `/proc/PID/maps`.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::{Error, Result, PAGE};

/// Runs of equal counts: `(start, end, count)`.
pub fn runs(start: usize, counts: &[u32]) -> Vec<(usize, usize, u32)> {
    let mut out: Vec<(usize, usize, u32)> = Vec::new();
    for (i, &c) in counts.iter().enumerate() {
        let a = start + i * PAGE;
        match out.last_mut() {
            Some(last) if last.2 == c && last.1 == a => last.1 = a + PAGE,
            _ => out.push((a, a + PAGE, c)),
        }
    }
    out
}

/// One `start-end : 0xCOUNT` line.
pub fn run_line(start: usize, end: usize, count: u32) -> String {
    format!("{start:08x}-{end:08x} : 0x{count:08x}")
}

/// The page_acs text of one tracked range under its maps header line.
pub fn page_acs(header: &str, start: usize, counts: &[u32]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{header}");
    for (a, b, c) in runs(start, counts) {
        let _ = writeln!(s, "{}", run_line(a, b, c));
    }
    s
}

/// A published range: its bounds and its runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedRange {
    pub start: usize,
    pub end: usize,
    pub runs: Vec<(usize, usize, u32)>,
}

/// Serialise ranges for publication.
pub fn encode(ranges: &[(usize, Vec<u32>)]) -> String {
    let getters: Vec<Box<dyn Fn(usize) -> u32 + '_>> =
        ranges.iter().map(|(_, c)| Box::new(move |i: usize| c[i]) as Box<dyn Fn(usize) -> u32 + '_>).collect();
    let views: Vec<RangeView<'_>> =
        ranges.iter().zip(&getters).map(|((start, c), g)| (*start, c.len(), g.as_ref())).collect();
    let mut out = Vec::new();
    write_encoded(&mut out, &views).expect("writing to a Vec cannot fail");
    String::from_utf8(out).expect("ASCII")
}

/// A range to publish read on the fly: start, pages, and the count of page `i`.
pub type RangeView<'a> = (usize, usize, &'a dyn Fn(usize) -> u32);

/// Write the published form of `ranges` (what [`encode`] returns) without copying the counts:
/// the runs are found as the counts are read.
pub fn write_encoded(w: &mut impl std::io::Write, ranges: &[RangeView<'_>]) -> std::io::Result<()> {
    writeln!(w, "# pagewise hps acscount v1")?;
    for &(start, pages, count) in ranges {
        writeln!(w, "range {:x} {:x}", start, start + pages * PAGE)?;
        let mut i = 0;
        while i < pages {
            let c = count(i);
            let mut j = i + 1;
            while j < pages && count(j) == c {
                j += 1;
            }
            writeln!(w, "{}", run_line(start + i * PAGE, start + j * PAGE, c))?;
            i = j;
        }
    }
    Ok(())
}

fn hex(s: &str) -> Result<usize> {
    usize::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|_| Error::Parse(format!("not hex: {s:?}")))
}

/// Parse a published file.
pub fn decode(text: &str) -> Result<Vec<PublishedRange>> {
    let mut out: Vec<PublishedRange> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty() && !l.starts_with('#')) {
        if let Some(rest) = line.strip_prefix("range ") {
            let mut it = rest.split_whitespace();
            let (Some(a), Some(b)) = (it.next(), it.next()) else {
                return Err(Error::Parse(format!("bad range line {line:?}")));
            };
            out.push(PublishedRange { start: hex(a)?, end: hex(b)?, runs: Vec::new() });
        } else {
            let (span, count) = line.split_once(" : ").ok_or_else(|| Error::Parse(format!("bad line {line:?}")))?;
            let (a, b) = span.split_once('-').ok_or_else(|| Error::Parse(format!("bad span {span:?}")))?;
            let r = out.last_mut().ok_or_else(|| Error::Parse("run before any range".into()))?;
            r.runs.push((hex(a)?, hex(b)?, hex(count)? as u32));
        }
    }
    Ok(out)
}

/// Where process `pid` publishes its counts.
pub fn published_path(pid: i32) -> PathBuf {
    PathBuf::from(format!("/run/pagewise/hps/{pid}.acs"))
}

/// Create the directory of published files; the first time in this process, also remove the
/// files of processes that no longer exist: a tracked process that was killed (SIGKILL) never
/// unpublishes, and without this its file would stay in /run until reboot.
fn prepare_dir(path: &std::path::Path) -> std::io::Result<()> {
    static PRUNED: std::sync::Once = std::sync::Once::new();
    let dir = path.parent().expect("has a parent");
    std::fs::create_dir_all(dir)?;
    PRUNED.call_once(|| remove_dead(dir));
    Ok(())
}

/// Remove `PID.acs` files (and their temporaries) in `dir` whose process is gone.
fn remove_dead(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(published_pid) else { continue };
        if !pagewise_kernel::signal::process_alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The process id a published file's name (`PID.acs` or `PID.acs.tmp`) belongs to.
fn published_pid(name: &str) -> Option<i32> {
    let stem = name.strip_suffix(".acs").or_else(|| name.strip_suffix(".acs.tmp"))?;
    stem.parse().ok().filter(|&pid| pid > 0)
}

/// Publish this process's counts (atomically replacing the previous file).
pub fn publish(pid: i32, ranges: &[(usize, Vec<u32>)]) -> Result<()> {
    let path = published_path(pid);
    let io = |source| Error::Io { path: path.display().to_string(), source };
    prepare_dir(&path).map_err(io)?;
    let tmp = path.with_extension("acs.tmp");
    std::fs::write(&tmp, encode(ranges)).map_err(io)?;
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(())
}

/// Publish like [`publish`], reading the counts on the fly through a small buffer: a tracker
/// publishing every half second then allocates no copy of its counts (a 1 GiB arena's are 1 MiB,
/// their text several), which the allocator would keep resident in the tracking thread.
/// `note` (one line, may be empty) is written as a comment after the header, e.g. the tracking
/// state: `# tracking converged`.
pub fn publish_views(pid: i32, note: &str, ranges: &[RangeView<'_>]) -> Result<()> {
    let path = published_path(pid);
    let io = |source| Error::Io { path: path.display().to_string(), source };
    prepare_dir(&path).map_err(io)?;
    let tmp = path.with_extension("acs.tmp");
    let file = std::fs::File::create(&tmp).map_err(io)?;
    let mut w = std::io::BufWriter::with_capacity(16 << 10, file);
    if !note.is_empty() {
        std::io::Write::write_all(&mut w, format!("# {}\n", note.replace('\n', " ")).as_bytes()).map_err(io)?;
    }
    write_encoded(&mut w, ranges).map_err(io)?;
    std::io::Write::flush(&mut w).map_err(io)?;
    drop(w);
    std::fs::rename(&tmp, &path).map_err(io)?;
    Ok(())
}

/// Remove the published file of `pid` (tracking stopped).
pub fn unpublish(pid: i32) {
    let _ = std::fs::remove_file(published_path(pid));
}

/// Join published ranges with maps text: each VMA that overlaps a range gets its header line
/// followed by the range's runs inside it.
pub fn render(maps: &str, ranges: &[PublishedRange]) -> String {
    let mut s = String::new();
    for line in maps.lines() {
        let Some(span) = line.split_whitespace().next() else { continue };
        let Some((a, b)) = span.split_once('-') else { continue };
        let (Ok(a), Ok(b)) = (hex(a), hex(b)) else { continue };
        let inside: Vec<&(usize, usize, u32)> =
            ranges.iter().flat_map(|r| r.runs.iter()).filter(|run| run.0 < b && run.1 > a).collect();
        if inside.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{line}");
        for &&(x, y, c) in &inside {
            let _ = writeln!(s, "{}", run_line(x.max(a), y.min(b), c));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_acs_matches_the_seed_layout() {
        let text = page_acs("00400000-00404000 r-xp 00000000 08:01 1 /bin/x", 0x400000, &[0x121, 0x121, 0, 3]);
        assert_eq!(
            text,
            "00400000-00404000 r-xp 00000000 08:01 1 /bin/x\n\
             00400000-00402000 : 0x00000121\n\
             00402000-00403000 : 0x00000000\n\
             00403000-00404000 : 0x00000003\n"
        );
    }

    #[test]
    fn published_file_names_name_their_process() {
        assert_eq!(published_pid("1234.acs"), Some(1234));
        assert_eq!(published_pid("1234.acs.tmp"), Some(1234));
        for name in ["1234", "x.acs", "0.acs", "-5.acs", "1234.acs.old", ".acs"] {
            assert_eq!(published_pid(name), None, "{name}");
        }
    }

    #[test]
    fn files_of_dead_processes_are_removed_and_others_kept() {
        let scratch = pagewise_kernel::private_dir::PrivateDir::new("acs-test").unwrap();
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).unwrap();
        // A child that has exited and been reaped: its pid names no process (until reused,
        // which within this test is vanishingly unlikely).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        for name in [format!("{dead}.acs"), format!("{dead}.acs.tmp"), format!("{live}.acs"), "notes.txt".into()] {
            std::fs::write(dir.join(name), "x").unwrap();
        }
        remove_dead(&dir);
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, vec![format!("{live}.acs"), "notes.txt".to_string()]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn encode_decode_render_round_trip() {
        let ranges = vec![(0x7f0000200000usize, vec![1, 1, 0, 5]), (0x7f0000800000, vec![2])];
        let dec = decode(&encode(&ranges)).unwrap();
        assert_eq!(dec.len(), 2);
        assert_eq!(
            dec[0].runs,
            vec![
                (0x7f0000200000, 0x7f0000202000, 1),
                (0x7f0000202000, 0x7f0000203000, 0),
                (0x7f0000203000, 0x7f0000204000, 5)
            ]
        );
        let maps = "7f0000200000-7f0000400000 rw-s 00000000 00:01 5 /memfd:hps (deleted)\n\
                    7f0000800000-7f0000a00000 rw-s 00000000 00:01 6 /memfd:hps2 (deleted)\n\
                    7fff00000000-7fff00021000 rw-p 00000000 00:00 0 [stack]\n";
        let out = render(maps, &dec);
        assert!(out.starts_with("7f0000200000-7f0000400000 rw-s"));
        assert!(out.contains("7f0000203000-7f0000204000 : 0x00000005"));
        assert!(out.contains("7f0000800000-7f0000801000 : 0x00000002"));
        assert!(!out.contains("[stack]"));
        assert!(decode("junk line").is_err());
    }
}
