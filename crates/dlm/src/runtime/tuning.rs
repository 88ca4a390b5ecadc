//! The unit size's tuning as the runtime sees it: loops the program marks (`dlm_start` /
//! `dlm_end`), the decisions' record, and the state the window tuner reads (the program's CPU
//! time, the units touched). The rules themselves are pure, in `tune/`.

use super::{Dlm, DlmError, State};
use crate::config::Config;

impl Dlm {
    /// Begin measuring loop `id` (`dlm_start`): its own unit size comes into force and the
    /// pages it faults on are recorded until [`Dlm::loop_end`]. Loops do not nest.
    pub fn loop_start(&self, id: u64) -> Result<(), DlmError> {
        if id == crate::measure::WINDOW_ID {
            return Err(DlmError::Config(format!("loop id {id} is reserved for tuning windows")));
        }
        let mut st = self.inner.lock();
        if let Some((other, _)) = st.measure.active {
            return Err(DlmError::Config(format!("loop {other} is still being measured (no dlm_end yet)")));
        }
        let cur = st.set_count;
        let set = st.measure.loops.entry(id).or_insert_with(|| crate::tune::LoopState::new(cur)).set;
        st.apply_set_count(set);
        st.clear_touched();
        st.measure.loop_faults = 0;
        st.measure.active = Some((id, std::time::Instant::now()));
        Ok(())
    }

    /// End measuring loop `id` (`dlm_end`): the tuner decides the loop's next unit size, which
    /// is in force from now on. Returns the decision.
    pub fn loop_end(&self, id: u64) -> Result<crate::tune::Decision, DlmError> {
        let mut st = self.inner.lock();
        let (active, started) =
            st.measure.active.ok_or_else(|| DlmError::Config(format!("dlm_end({id}) without dlm_start")))?;
        if active != id {
            return Err(DlmError::Config(format!("dlm_end({id}) while loop {active} is being measured")));
        }
        let time = started.elapsed().as_secs_f64();
        let touched = st.touched();
        let tuner = st.measure.tuner;
        let state = st.measure.loops.get_mut(&id).expect("created at start");
        let d = crate::tune::decide(&tuner, state, &touched, time, id);
        let set = state.set;
        st.measure.log(d);
        st.measure.active = None;
        let cpu = st.program_cpu();
        st.measure.reset_window(std::time::Instant::now(), cpu);
        st.apply_set_count(set);
        st.clear_touched();
        Ok(d)
    }

    /// Write the tuner's decisions to `Config::decisions_path` (if set) now; the runtime keeps
    /// running. For a process about to exit (`dlm_finish`).
    pub fn write_decisions(&self) {
        let st = self.inner.lock();
        write_decisions(&self.inner.cfg, &st.measure);
    }

    /// Every tuning decision so far, oldest first.
    pub fn decisions(&self) -> Vec<crate::tune::Decision> {
        self.inner.lock().measure.decisions.clone()
    }

    /// The decisions as JSON: `{"decisions": [...], "dropped": N, "table": "..."}`.
    pub fn decisions_json(&self) -> String {
        let st = self.inner.lock();
        decisions_json(&st.measure)
    }
}

pub(super) fn write_decisions(cfg: &Config, m: &crate::measure::Measure) {
    if let Some(path) = &cfg.decisions_path {
        if let Err(e) = std::fs::write(path, decisions_json(m)) {
            eprintln!("pagewise dlm: writing the tuner's decisions to {} failed: {e}", path.display());
        }
    }
}

fn decisions_json(m: &crate::measure::Measure) -> String {
    serde_json::json!({
        "decisions": m.decisions,
        "dropped": m.dropped,
        "table": crate::tune::format_table(&m.decisions),
    })
    .to_string()
}

impl State {
    /// The program's CPU time so far: the process's, less the handler thread's.
    pub(super) fn program_cpu(&self) -> std::time::Duration {
        let runtime = self.handler_clock.map_or(std::time::Duration::ZERO, |c| c.now());
        pagewise_kernel::cpu::CpuClock::PROCESS.now().saturating_sub(runtime)
    }

    /// Put set count `count` in force. Streams go on: each read-ahead window keeps its length
    /// in bytes (the fault path takes a fault in the unit holding a stream's end as its next).
    pub(super) fn apply_set_count(&mut self, count: u32) {
        let old = std::mem::replace(&mut self.set_count, count) as usize;
        for a in self.areas.iter_mut().flatten() {
            a.window = a.window * old / count as usize;
        }
    }

    /// For each candidate unit size, the units the pages marked since the last clear touch.
    pub(super) fn touched(&self) -> crate::tune::Touched {
        let mut t = crate::tune::Touched::default();
        for a in self.areas.iter().flatten() {
            t.add_bitmap(&a.touched, a.layout.pages, a.layout.max_set as u32);
        }
        t
    }

    pub(super) fn clear_touched(&mut self) {
        for a in self.areas.iter_mut().flatten() {
            a.touched.iter_mut().for_each(|w| *w = 0);
        }
    }
}
