//! What the processes a wrapped program started or forked did with large allocations
//! (preload/others.c): each that routed anything, and each forked child that kept an
//! allocation in local memory that its parent would have routed, leaves one line in a
//! directory of the run's, and the wrapper sums them into the report once the program has
//! ended. Without it, `pagewise run -- mpirun -np 2 hpcc` warned that nothing ran on DLM memory
//! while both ranks did, and PostgreSQL, whose forked backends do the work, was said to have
//! made no large allocation.

use std::path::Path;

/// One process's line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Counts {
    /// `started ARENA ALLOCATIONS BYTES PEAK_BYTES REFUSED`: a process the program started
    /// (exec), with a runtime of its own, and what it routed.
    Started { arena: String, allocations: u64, bytes: u64, peak: u64, refused: u64 },
    /// `forked ARENA ALLOCATIONS BYTES MIN_ALLOC`: a child made by fork, which routes nothing,
    /// and the allocations of at least `min_alloc` bytes it kept in local memory.
    Forked { arena: String, allocations: u64, bytes: u64, min_alloc: u64 },
}

/// Parse one process's line; None for anything else (a line cut short by a process killed
/// while writing it).
pub(crate) fn parse(line: &str) -> Option<Counts> {
    let line = line.strip_suffix('\n')?;
    let mut f = line.split(' ');
    let kind = f.next()?;
    let arena = f.next().filter(|a| !a.is_empty() && a.bytes().all(|c| c.is_ascii_lowercase()))?.to_string();
    let mut num = || f.next()?.parse::<u64>().ok();
    let c = match kind {
        "started" => Counts::Started { arena, allocations: num()?, bytes: num()?, peak: num()?, refused: num()? },
        "forked" => Counts::Forked { arena, allocations: num()?, bytes: num()?, min_alloc: num()? },
        _ => return None,
    };
    f.next().is_none().then_some(c)
}

/// The report's lines for the processes' counts (those of one arena: a wrapper runs one): one
/// for the processes the program started, one for those it forked, each when there are any.
pub(crate) fn summary(counts: &[Counts]) -> Vec<String> {
    let processes = |n: usize| if n == 1 { "process" } else { "processes" };
    let mut lines = Vec::new();
    let started: Vec<_> = counts
        .iter()
        .filter_map(|c| match c {
            Counts::Started { arena, allocations, bytes, peak, refused } => {
                Some((arena, allocations, bytes, peak, refused))
            }
            Counts::Forked { .. } => None,
        })
        .collect();
    if let Some((arena, ..)) = started.first() {
        let n = started.len();
        lines.push(format!(
            "pagewise: {n} {} the program started ran on {arena} memory too, {}: {} allocation(s) ({} MiB over \
             their runs, at most {} MiB at once in one), {} refused (left in libc)",
            processes(n),
            if n == 1 {
                "with its own runtime and its own limits"
            } else {
                "each with its own runtime and its own limits"
            },
            started.iter().map(|s| s.1).sum::<u64>(),
            started.iter().map(|s| s.2).sum::<u64>() >> 20,
            started.iter().map(|s| *s.3).max().unwrap_or(0) >> 20,
            started.iter().map(|s| s.4).sum::<u64>(),
        ));
    }
    let forked: Vec<_> = counts
        .iter()
        .filter_map(|c| match c {
            Counts::Forked { arena, allocations, bytes, min_alloc } => Some((arena, allocations, bytes, min_alloc)),
            Counts::Started { .. } => None,
        })
        .collect();
    if let Some((arena, _, _, min_alloc)) = forked.first() {
        let n = forked.len();
        lines.push(format!(
            "pagewise: {n} {} the program forked kept {} allocation(s) of at least {min_alloc} bytes ({} MiB over \
             their runs) in local memory, not on {arena} memory: a forked child routes nothing of its own (it \
             gets a copy of what was routed at the fork)",
            processes(n),
            forked.iter().map(|f| f.1).sum::<u64>(),
            forked.iter().map(|f| f.2).sum::<u64>() >> 20,
        ));
    }
    lines
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
    fn lines_as_the_shim_writes_them_are_read() {
        assert_eq!(
            parse("started dlm 14 398458880 125829120 1\n").unwrap(),
            Counts::Started { arena: "dlm".into(), allocations: 14, bytes: 398_458_880, peak: 125_829_120, refused: 1 }
        );
        assert_eq!(
            parse("forked hps 3 6291456 1048576\n").unwrap(),
            Counts::Forked { arena: "hps".into(), allocations: 3, bytes: 6_291_456, min_alloc: 1_048_576 }
        );
    }

    #[test]
    fn lines_cut_short_or_not_the_shims_are_skipped() {
        for bad in [
            "",
            "started dlm 14 3",
            "started dlm 14 398458880 125829120 1",
            "started dlm 1 2 3 4 5\n",
            "started DLM 1 2 3 4\n",
            "started dlm x 2 3 4\n",
            "dlm 1 2 3 4\n",
            "forked dlm 1 2\n",
            "forked dlm 1 2 3 4\n",
            "spawned dlm 1 2 3\n",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_summary_adds_up_and_takes_the_largest_peak() {
        let two = [
            parse("started dlm 7 104857600 52428800 0\n").unwrap(),
            parse("started dlm 9 209715200 83886080 2\n").unwrap(),
        ];
        assert_eq!(
            summary(&two),
            ["pagewise: 2 processes the program started ran on dlm memory too, each with its own runtime and its own \
              limits: 16 allocation(s) (300 MiB over their runs, at most 80 MiB at once in one), 2 refused (left in libc)"]
        );
        assert!(summary(&two[..1])[0]
            .starts_with("pagewise: 1 process the program started ran on dlm memory too, with its own"));
        assert!(summary(&[]).is_empty());
    }

    #[test]
    fn forked_children_get_a_line_of_their_own() {
        let counts = [
            parse("forked dlm 2 4194304 1048576\n").unwrap(),
            parse("started dlm 1 1048576 1048576 0\n").unwrap(),
            parse("forked dlm 3 6291456 1048576\n").unwrap(),
        ];
        let lines = summary(&counts);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("pagewise: 1 process the program started"), "{lines:?}");
        assert_eq!(
            lines[1],
            "pagewise: 2 processes the program forked kept 5 allocation(s) of at least 1048576 bytes (10 MiB over \
             their runs) in local memory, not on dlm memory: a forked child routes nothing of its own (it gets a \
             copy of what was routed at the fork)"
        );
    }
}
