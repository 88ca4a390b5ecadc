//! What the processes a wrapped program started put on the arena (preload/others.c): each that
//! routed anything leaves one line in a directory of the run's, and the wrapper sums them
//! into one line of the report once the program has ended. Without it,
//! `pagewise run -- mpirun -np 2 hpcc` warned that nothing ran on DLM memory while both ranks
//! did.

use std::path::Path;

/// One process's counts: `ARENA ALLOCATIONS BYTES PEAK_BYTES REFUSED`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) arena: String,
    pub(crate) allocations: u64,
    pub(crate) bytes: u64,
    pub(crate) peak: u64,
    pub(crate) refused: u64,
}

/// Parse one process's line; None for anything else (a line cut short by a process killed
/// while writing it).
pub(crate) fn parse(line: &str) -> Option<Counts> {
    let line = line.strip_suffix('\n')?;
    let mut f = line.split(' ');
    let arena = f.next().filter(|a| !a.is_empty() && a.bytes().all(|c| c.is_ascii_lowercase()))?.to_string();
    let mut num = || f.next()?.parse::<u64>().ok();
    let c = Counts { arena, allocations: num()?, bytes: num()?, peak: num()?, refused: num()? };
    f.next().is_none().then_some(c)
}

/// The report's line for the processes' counts (those of one arena: a wrapper runs one).
pub(crate) fn summary(counts: &[Counts]) -> Option<String> {
    let first = counts.first()?;
    let n = counts.len();
    let sum = |f: fn(&Counts) -> u64| counts.iter().map(f).sum::<u64>();
    let peak = counts.iter().map(|c| c.peak).max().unwrap_or(0);
    Some(format!(
        "pagewise: {n} process{} the program started ran on {} memory too, {}: {} allocation(s) ({} MiB over \
         their runs, at most {} MiB at once in one), {} refused (left in libc)",
        if n == 1 { "" } else { "es" },
        first.arena,
        if n == 1 { "with its own runtime and its own limits" } else { "each with its own runtime and its own limits" },
        sum(|c| c.allocations),
        sum(|c| c.bytes) >> 20,
        peak >> 20,
        sum(|c| c.refused),
    ))
}

/// Read every process's line in `dir`; unreadable or malformed files are skipped.
pub(crate) fn read(dir: &Path) -> Vec<Counts> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut counts: Vec<(String, Counts)> = entries
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), parse(&text)?))
        })
        .collect();
    counts.sort_by(|a, b| a.0.cmp(&b.0));
    counts.into_iter().map(|(_, c)| c).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_as_the_shim_writes_it_is_read() {
        let c = parse("dlm 14 398458880 125829120 1\n").unwrap();
        assert_eq!(
            c,
            Counts { arena: "dlm".into(), allocations: 14, bytes: 398_458_880, peak: 125_829_120, refused: 1 }
        );
    }

    #[test]
    fn lines_cut_short_or_not_the_shims_are_skipped() {
        for bad in ["", "dlm 14 3", "dlm 14 398458880 125829120 1", "dlm 1 2 3 4 5\n", "DLM 1 2 3 4\n", "dlm x 2 3 4\n"]
        {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_summary_adds_up_and_takes_the_largest_peak() {
        let two = [parse("dlm 7 104857600 52428800 0\n").unwrap(), parse("dlm 9 209715200 83886080 2\n").unwrap()];
        assert_eq!(
            summary(&two).unwrap(),
            "pagewise: 2 processes the program started ran on dlm memory too, each with its own runtime and its own \
             limits: 16 allocation(s) (300 MiB over their runs, at most 80 MiB at once in one), 2 refused (left in libc)"
        );
        assert!(summary(&two[..1])
            .unwrap()
            .starts_with("pagewise: 1 process the program started ran on dlm memory too, with its own"));
        assert_eq!(summary(&[]), None);
    }
}
