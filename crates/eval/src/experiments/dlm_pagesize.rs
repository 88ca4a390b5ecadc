//! `dlm-pagesize`: the seed's Table 2 on Pagewise's own BT-like workload.
//!
//! The workload is an ADI-style solver shaped like NPB BT: seven N³ arrays of f64 (u, rhs,
//! forcing and four auxiliary arrays, x fastest). Per iteration a compute_rhs pass streams
//! through all of them point by point, then three sweeps — along x, along y, along z — solve one
//! tridiagonal system per grid line with the Thomas algorithm (the per-line coefficients in a
//! small buffer, as BT keeps its per-line lhs; d' in rhs; the result in u). Lines are visited
//! with x fastest, so a z sweep at one y touches one row of every z-plane of u and rhs: its
//! working set is N planes × 2 arrays × one page. Small pages keep it small; once a page holds
//! a whole plane, the z sweep needs all of u and rhs (2/7 of the memory), and with less local
//! memory than that, pages thrash between host and server — the effect the seed measured on
//! BT.A (Table 2). Each cell runs the solver on DLM memory with the local limit at
//! a ratio of the arrays' size and one page size (base page = page size, set count 1, no
//! read-ahead, as in the seed), against two `pagewise dlm-server` processes. The result (a
//! checksum of u) must be bit-identical in every cell; each cell runs 3 times, interleaved, and the table
//! gives median [min–max]. Time is relative to 100% local memory
//! with the same page size. Cells over the time budget are reported as "> budget"; cells
//! where the limit is below two pages cannot run ("—").

use std::time::{Duration, Instant};

use pagewise_dlm::auth::Secret;
use pagewise_dlm::process::{pagewise_binary, ServerProcess};
use pagewise_dlm::{Config, Dlm};
use serde_json::json;

use crate::{human_bytes, ratio, Context, Experiment, Plot, Report, Summary, Table};

pub struct DlmPagesize;

/// u, rhs, forcing and four auxiliary arrays (BT's qs, rho_i, square, ws).
pub(crate) const ARRAYS: usize = 7;

/// The arrays, as raw pointers into one DLM area.
pub(crate) struct Grid {
    n: usize,
    /// a[0] = u, a[1] = rhs, a[2] = forcing, a[3..7] = auxiliary.
    a: [*mut f64; ARRAYS],
}

impl Grid {
    pub(crate) fn new(n: usize, area: *mut f64) -> Self {
        let elems = n * n * n;
        // SAFETY: the area holds ARRAYS arrays of elems f64 each.
        Grid { n, a: std::array::from_fn(|k| unsafe { area.add(k * elems) }) }
    }

    fn idx(&self, x: usize, y: usize, z: usize) -> usize {
        (z * self.n + y) * self.n + x
    }

    /// Fill the arrays one after the other (sequential, so even two pages of local memory do).
    pub(crate) fn init(&self) {
        let n = self.n;
        for (k, &a) in self.a.iter().enumerate() {
            for i in 0..n * n * n {
                let (x, y, z) = (i % n, (i / n) % n, i / (n * n));
                let f = if k == 2 { ((x * 7 + y * 13 + z * 29) % 97) as f64 / 97.0 } else { 0.0 };
                // SAFETY: i < n³, inside the array.
                unsafe { a.add(i).write(f) };
            }
        }
    }

    /// BT's compute_rhs: a pass over every array at once, point by point.
    fn compute_rhs(&self, late: &mut impl FnMut() -> bool) -> bool {
        let [u, rhs, forcing, qs, rho, square, ws] = self.a;
        let n = self.n;
        for line in 0..n * n {
            for i in line * n..(line + 1) * n {
                // SAFETY: i < n³.
                unsafe {
                    let v = *u.add(i);
                    let r = 1.0 / (1.0 + v * v);
                    *rho.add(i) = r;
                    *qs.add(i) = 0.5 * v * v * r;
                    *square.add(i) = v * r;
                    *ws.add(i) = v - *qs.add(i);
                    *rhs.add(i) = *forcing.add(i) + 0.1 * (*square.add(i) - *ws.add(i) * *rho.add(i));
                }
            }
            if late() {
                return false;
            }
        }
        true
    }

    /// Solve one line of `n` points from `start` with `stride` (elements): the tridiagonal
    /// system (-1, 4, -1) · u_new = u + rhs, Thomas algorithm, c' in a per-line buffer (as
    /// BT keeps its per-line lhs), d' in rhs.
    #[inline]
    fn line(&self, start: usize, stride: usize, c: &mut [f64]) {
        let [u, rhs, ..] = self.a;
        let n = self.n;
        // SAFETY: every index is start + k*stride with k < n, inside the arrays (whole body).
        unsafe {
            let mut c_prev = 0.0;
            let mut d_prev = 0.0;
            for (k, ck) in c.iter_mut().enumerate().take(n) {
                let i = start + k * stride;
                let b = 4.0 + c_prev;
                *ck = -1.0 / b;
                let d = (*u.add(i) + *rhs.add(i) + d_prev) / b;
                *rhs.add(i) = d;
                c_prev = *ck;
                d_prev = d;
            }
            let mut next = 0.0;
            for k in (0..n).rev() {
                let i = start + k * stride;
                let v = *rhs.add(i) - c[k] * next;
                *u.add(i) = v * 0.5;
                next = v;
            }
        }
    }

    /// One iteration: compute_rhs, then x, y and z sweeps. False when the deadline passed (the
    /// run is censored); the clock is read every 16 lines.
    pub(crate) fn iterate(&self, deadline: Instant) -> bool {
        let n = self.n;
        let mut c = vec![0.0; n];
        let mut lines = 0usize;
        let mut late = || {
            lines += 1;
            lines.is_multiple_of(16) && Instant::now() > deadline
        };
        if !self.compute_rhs(&mut late) {
            return false;
        }
        // (direction, stride): lines along x, y, z; p is the faster of the other two axes.
        for (dir, stride) in [(0, 1), (1, n), (2, n * n)] {
            for q in 0..n {
                for p in 0..n {
                    let start = match dir {
                        0 => self.idx(0, p, q),
                        1 => self.idx(p, 0, q),
                        _ => self.idx(p, q, 0),
                    };
                    self.line(start, stride, &mut c);
                    if late() {
                        return false;
                    }
                }
            }
        }
        true
    }

    pub(crate) fn checksum(&self) -> u64 {
        let mut h = 0u64;
        for i in 0..self.n * self.n * self.n {
            // SAFETY: i < n³.
            h = h.rotate_left(5) ^ unsafe { self.a[0].add(i).read() }.to_bits();
        }
        h
    }
}

enum Cell {
    Ran { secs: f64, checksum: u64, fetched: u64, evictions: u64 },
    OverBudget,
    Impossible,
}

fn run_cell(
    servers: &[String],
    secret: &Secret,
    n: usize,
    page: usize,
    local: usize,
    iterations: usize,
    budget: Duration,
) -> anyhow::Result<Cell> {
    let elems = n * n * n;
    let array_bytes = elems * 8;
    if local < 2 * page {
        return Ok(Cell::Impossible);
    }
    let cfg = Config {
        servers: servers.to_vec(),
        secret: Some(secret.clone()),
        local_mem: local,
        base_page: page,
        max_set: 1,
        set_count: 1,
        readahead: 0,
        zero_copy: false,
        ..Config::default()
    };
    let dlm = Dlm::init(cfg)?;
    let area = dlm.alloc(array_bytes * ARRAYS)? as *mut f64;
    let grid = Grid::new(n, area);
    grid.init();
    let before = dlm.stats();
    let t = Instant::now();
    let deadline = t + budget;
    let mut finished = true;
    for _ in 0..iterations {
        if !grid.iterate(deadline) {
            finished = false;
            break;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let after = dlm.stats();
    let checksum = if finished { grid.checksum() } else { 0 };
    dlm.shutdown();
    Ok(if finished {
        Cell::Ran {
            secs,
            checksum,
            fetched: after.fetched_units - before.fetched_units,
            evictions: after.evictions - before.evictions,
        }
    } else {
        Cell::OverBudget
    })
}

impl Experiment for DlmPagesize {
    fn name(&self) -> &'static str {
        "dlm-pagesize"
    }

    fn description(&self) -> &'static str {
        "BT-like ADI solver on DLM memory: local memory 100..5% × page size 4 KiB..1 MiB, time relative to 100% (seed Table 2)"
    }

    fn run(&self, ctx: &mut Context) -> anyhow::Result<Report> {
        let bin = pagewise_binary()?;
        let n: usize = ctx.mode.pick(64, 96);
        let iterations: usize = ctx.mode.pick(3, 5);
        let reps: usize = 3;
        let budget = Duration::from_secs(ctx.mode.pick(4, 120));
        let pages: Vec<usize> = ctx.mode.pick(
            vec![1 << 20, 256 << 10, 64 << 10, 16 << 10, 4 << 10],
            vec![1 << 20, 512 << 10, 256 << 10, 128 << 10, 64 << 10, 32 << 10, 16 << 10, 8 << 10, 4 << 10],
        );
        let ratios = [100usize, 75, 50, 25, 10, 5];
        let total = n * n * n * 8 * ARRAYS;
        let secret = Secret::generate()?;
        let servers = [ServerProcess::spawn(&bin, "4G", &secret)?, ServerProcess::spawn(&bin, "4G", &secret)?];
        let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
        ctx.start_progress((pages.len() * ratios.len() * reps) as u64, "cells");
        let mut headers = vec!["page".to_string()];
        headers.extend(ratios.iter().map(|r| format!("{r}%")));
        headers.push("100% s".into());
        let mut table = Table::new(headers);
        let mut plot = Plot::new("BT-like solver on DLM", "local memory (% of arrays)", "time / time at 100%");
        let mut data = Vec::new();
        let mut report = Report::default();
        let mut reference: Option<u64> = None;
        let local_of = |page: usize, r: usize| {
            // 100% means the arrays plus one page of slack (the limit counts whole pages).
            if r == 100 {
                total + 2 * page
            } else {
                (total * r / 100) / page * page
            }
        };
        // Every cell `reps` times, interleaved: rep 0 of every cell, then rep 1, … so drift of
        // the machine hits every cell alike. Cells are (page, ratio) in row order.
        let mut cells: Vec<Vec<Cell>> = Vec::new();
        for rep in 0..reps {
            ctx.message(format!("repetition {}/{reps}", rep + 1));
            let mut k = 0;
            for &page in &pages {
                for &r in &ratios {
                    let cell = run_cell(&addrs, &secret, n, page, local_of(page, r), iterations, budget)?;
                    ctx.tick();
                    if let Cell::Ran { checksum, .. } = &cell {
                        match reference {
                            None => reference = Some(*checksum),
                            Some(c) => anyhow::ensure!(
                                c == *checksum,
                                "page {page} at {r}%: result differs from the first cell (DLM returned wrong data)"
                            ),
                        }
                    }
                    if rep == 0 {
                        cells.push(Vec::new());
                    }
                    cells[k].push(cell);
                    k += 1;
                }
            }
        }
        let mut k = 0;
        for &page in &pages {
            let mut row = vec![human_bytes(page as u64)];
            let secs_of = |c: &Cell| if let Cell::Ran { secs, .. } = c { *secs } else { f64::NAN };
            // The row's reference: the median at 100% local memory.
            let base_secs = Summary::of(&cells[k].iter().map(secs_of).collect::<Vec<_>>()).median;
            let mut pts = Vec::new();
            for &r in &ratios {
                let reps_here = &cells[k];
                k += 1;
                let local = local_of(page, r);
                if reps_here.iter().any(|c| matches!(c, Cell::Impossible)) {
                    row.push("—".to_string());
                    continue;
                }
                let censored = reps_here.iter().any(|c| matches!(c, Cell::OverBudget));
                let rels: Vec<f64> = reps_here.iter().map(|c| ratio(secs_of(c), base_secs)).collect();
                for (rep, c) in reps_here.iter().enumerate() {
                    match c {
                        Cell::Ran { secs, fetched, evictions, .. } => data.push(json!({"page": page, "ratio": r,
                            "local": local, "rep": rep, "secs": secs, "relative": ratio(*secs, base_secs),
                            "fetched_units": fetched, "evictions": evictions})),
                        _ => data.push(json!({"page": page, "ratio": r, "local": local, "rep": rep,
                            "over_budget_s": budget.as_secs()})),
                    }
                }
                if censored {
                    row.push(format!("> {:.0}", ratio(budget.as_secs_f64(), base_secs)));
                    continue;
                }
                let sum = Summary::of(&rels);
                pts.push((r as f64, sum.median));
                if page == 16 << 10 || page == 1 << 20 {
                    report.figure(&format!("rel_{}k_{r}pct", page >> 10), sum.median);
                }
                row.push(sum.display(2));
            }
            row.push(format!("{base_secs:.3}"));
            table.row(row);
            plot.series(human_bytes(page as u64), pts);
        }
        for s in servers {
            let _ = s.stop();
        }
        report.figure("arrays_bytes", total as u64);
        report.figure("grid_n", n as u64);
        report.table(
            format!(
                "Time relative to 100% local memory ({}×{}×{} grid, {} arrays = {}, {} iteration(s), 2 memory servers)",
                n,
                n,
                n,
                ARRAYS,
                human_bytes(total as u64),
                iterations
            ),
            table,
        );
        report.plots.push(plot);
        report.data = json!(data);
        report.note(format!(
            "Rows: page size; columns: local memory as a share of the arrays. '> X' = stopped at the {} s budget \
             (at least X× slower, in any repetition); '—' = the limit is below two pages. Cells: median \
             [min–max] of 3 interleaved repetitions. Every finished cell's result is bit-identical. Seed (BT.A, T2K): 1024 KB pages at 5% = 1810×, 16 KB at 5% = 18.3×.",
            budget.as_secs()
        ));
        Ok(report)
    }
}
