//! Sampling a process's memory (RSS, AnonHugePages, ShmemPmdMapped) over time from a
//! background thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pagewise_kernel::procfs::{read_mem_usage, MemUsage, Pid};
use serde::Serialize;

/// One sample.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct MemSample {
    pub t_s: f64,
    pub usage: MemUsage,
}

/// Samples /proc/PID/smaps_rollup every `interval` until stopped.
pub struct MemSampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<MemSample>>>,
}

impl MemSampler {
    pub fn start(pid: Pid, interval: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                match read_mem_usage(pid) {
                    Ok(usage) => out.push(MemSample { t_s: t0.elapsed().as_secs_f64(), usage }),
                    Err(_) => break, // the process is gone
                }
                std::thread::sleep(interval);
            }
            out
        });
        MemSampler { stop, handle: Some(handle) }
    }

    /// Stop and return the samples.
    pub fn finish(mut self) -> Vec<MemSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

impl Drop for MemSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The largest RSS seen.
pub fn peak_rss(samples: &[MemSample]) -> u64 {
    samples.iter().map(|s| s.usage.rss).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_this_process() {
        let s = MemSampler::start(Pid::SelfProcess, Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(30));
        let samples = s.finish();
        assert!(samples.len() >= 2);
        assert!(peak_rss(&samples) > 0);
        assert!(samples.windows(2).all(|w| w[0].t_s <= w[1].t_s));
    }
}
