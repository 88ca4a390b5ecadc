//! System scope: the lowest-free low-memory zone against the core's per-zone thresholds
//! (kept above the kernel's own high watermark), and reclaim by dropping the page cache of
//! the coldest files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pagewise_kernel::cgroup::Reclaimed;
use pagewise_kernel::pagecache;
use pagewise_kernel::procfs::{read_vm_sysctl, read_zoneinfo, Zone};

use super::{Shared, Step, PAGE_SHIFT};
use crate::policy::{kernel_watermarks, Hysteresis, Watermarks, ZoneShape};

pub(super) fn system_step(
    core: &crate::policy::CoreThresholds,
    batch: u64,
    hyst: &mut BTreeMap<usize, Hysteresis>,
    warned: &mut bool,
    shared: &Shared,
) -> Step {
    let zones = read_zoneinfo()?;
    let wsf: u64 = read_vm_sysctl("watermark_scale_factor")?.parse().unwrap_or(10);
    let kmin: u64 = read_vm_sysctl("min_free_kbytes")?.parse().unwrap_or(0);
    let eff = effective_zone_watermarks(core, &zones, kmin, wsf);
    let (mut need, mut free_min) = (0, u64::MAX);
    for (i, (z, wm, raised)) in eff.iter().enumerate() {
        if *raised && !*warned {
            shared.say(format!(
                "zone {}: this core's low is not above the kernel's high; using low {} high {} pages",
                z.name, wm.low, wm.high
            ));
            *warned = true;
        }
        free_min = free_min.min(z.free);
        need = need.max(hyst.entry(i).or_default().step(z.free, *wm, batch));
    }
    Ok((free_min, need, None))
}

/// The core's per-zone watermarks, raised above the kernel's own high watermark where they are
/// not (so the worker starts before kswapd would): (zone, watermarks, raised?).
pub fn effective_zone_watermarks<'z>(
    core: &crate::policy::CoreThresholds,
    zones: &'z [Zone],
    kernel_min_free_kbytes: u64,
    wsf: u64,
) -> Vec<(&'z Zone, Watermarks, bool)> {
    let shapes: Vec<ZoneShape> =
        zones.iter().map(|z| ZoneShape { managed: z.managed, movable_or_high: z.name == "Movable" }).collect();
    let kernel = kernel_watermarks(kernel_min_free_kbytes, PAGE_SHIFT, wsf, &shapes);
    let lowmem: u64 = shapes.iter().filter(|s| !s.movable_or_high).map(|s| s.managed).sum();
    zones
        .iter()
        .zip(kernel)
        .filter(|(z, _)| z.is_populated() && z.name != "Movable")
        .map(|(z, k)| {
            let mut wm = core.zone_watermarks(PAGE_SHIFT, z.managed, lowmem);
            let raised = wm.low <= z.high.max(k.high);
            if raised {
                let gap = (wm.high - wm.low).max(z.high.max(k.high) - z.min.max(k.min));
                wm.low = z.high.max(k.high) + 1;
                wm.high = wm.high.max(wm.low + gap);
            }
            (z, wm, raised)
        })
        .collect()
}

/// System scope: drop the page cache of the coldest files (oldest access) under `paths` until
/// MemFree rose by `bytes`; then drop_caches if allowed. Returns the rise of MemFree.
pub(super) fn system_reclaim(bytes: u64, paths: &[PathBuf], drop_caches: bool) -> pagewise_kernel::Result<Reclaimed> {
    let free = || -> pagewise_kernel::Result<u64> { Ok(pagewise_kernel::procfs::read_meminfo()?.mem_free) };
    let start = free()?;
    let mut files = Vec::new();
    for p in paths {
        collect_files(p, &mut files, 0);
    }
    files.sort_by_key(|(_, atime)| *atime);
    for (f, _) in files {
        let _ = pagecache::drop_file_cache(&f);
        let freed = free()?.saturating_sub(start);
        if freed >= bytes {
            return Ok(Reclaimed { bytes: freed, exhausted: false });
        }
    }
    if drop_caches {
        pagecache::drop_caches(pagecache::DropCaches::PageCache)?;
    }
    let freed = free()?.saturating_sub(start);
    Ok(Reclaimed { bytes: freed, exhausted: freed < bytes })
}

fn collect_files(p: &Path, out: &mut Vec<(PathBuf, std::time::SystemTime)>, depth: usize) {
    let Ok(md) = std::fs::symlink_metadata(p) else { return };
    if md.is_file() {
        out.push((p.to_path_buf(), md.accessed().unwrap_or(std::time::UNIX_EPOCH)));
    } else if md.is_dir() && depth < 16 {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                collect_files(&e.path(), out, depth + 1);
            }
        }
    }
}
