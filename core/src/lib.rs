//! `cep._core`: the native matcher core of sparkcep.
//!
//! Python compiles a rule and exports it as a plain program (`cep/program.py`);
//! `Matcher(program, rule)` runs it with exactly the semantics of `cep/runtime/matcher.py`
//! behind the same methods (`initial`, `on_event`, `on_events`, `on_time`, `on_end`, `flush`,
//! `next_deadline`, `is_empty`, `partial_count`, `stats`). A key's state is an opaque `State`
//! (None when empty) that pickles as versioned bytes. No panic crosses the boundary: it becomes
//! `CoreError` naming the rule.

mod arrow;
mod budget;
mod engine;
mod evcodec;
mod family;
mod family_build;
mod expr;
mod json;
mod keycodec;
mod keys;
mod keytable;
mod matcher;
mod pack;
mod program;
mod state;
mod validate;
mod value;

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyFloat, PyList, PyString, PyTuple};

use crate::expr::{extract_fields, Ev};
use crate::matcher::{Classes, Core, MState, Out, ResultClass, Stats, FOREVER};
use crate::program::SkipK;
use crate::value::PyOps;

// Every allocation of the core (per event, per partial match, per encoded state) goes through
// mimalloc: glibc's malloc/free were ~30% of the engine's samples (bench/results/native.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (in the allocator's C library linked above).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_decommits` (mimalloc.h, v2 and v3).
const MI_OPTION_PURGE_DECOMMITS: std::ffi::c_int = 5;

/// Freed memory that mimalloc purges is reset (`MADV_FREE`: the OS may take it back when it
/// needs it) instead of decommitted: a decommitted page faults and is zeroed again when the
/// next batch reuses it. The engine frees most of a batch's memory before the next batch, and
/// on a loaded machine the 10 ms purge delay passes between batches: 20-55k page faults per
/// 1M fraud events, 2-3k with this (perf stat, bench/results/native.md, session 12). An explicit
/// `MIMALLOC_PURGE_DECOMMITS` in the environment wins.
fn tune_allocator() {
    if std::env::var_os("MIMALLOC_PURGE_DECOMMITS").is_none() {
        // SAFETY: a plain option store; mimalloc reads its options when it purges.
        unsafe { mi_option_set(MI_OPTION_PURGE_DECOMMITS, 0) };
    }
}

pyo3::create_exception!(_core, CoreError, PyException, "An internal error of the native core (a bug).");
pyo3::create_exception!(
    _core,
    Unsupported,
    PyException,
    "The rule program uses something this core does not run: use the Python matcher."
);

pub const DEFAULT_MAX_PARTIAL_MATCHES: usize = 10_000;

/// One key's matcher state. Opaque; pickles as versioned bytes (see `state.rs`).
#[pyclass(module = "cep._core", name = "State")]
pub struct State {
    pub inner: Option<MState>,
}

#[pymethods]
impl State {
    fn __reduce__(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, (Py<PyAny>,))> {
        let bytes = self.to_bytes(py)?;
        let f = py.import("cep._core")?.getattr("state_from_bytes")?.unbind();
        Ok((f, (bytes,)))
    }

    /// The versioned serialised form (`state_from_bytes` reads it back).
    fn to_bytes(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let empty = MState::default();
        let s = self.inner.as_ref().unwrap_or(&empty);
        state::encode(py, s)
    }

    fn __len__(&self) -> usize {
        self.inner.as_ref().map_or(0, |s| s.runs.iter().map(|r| r.entries.len()).sum())
    }
}

/// Read a state written by `State.to_bytes` (fails clearly on another format version).
#[pyfunction]
fn state_from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<State> {
    Ok(State { inner: Some(state::decode(py, data)?) })
}

/// The key-state fingerprint of a rule (`keycodec::fingerprint` of its id and version, the
/// rule's content hash): what the engine refuses to see twice, for checks before a build.
#[pyfunction]
fn rule_fingerprint(id: &str, version: &str) -> u32 {
    keycodec::fingerprint(id, version)
}

#[pyclass(module = "cep._core", name = "Matcher")]
pub struct Matcher {
    core: Core,
    #[pyo3(get)]
    rule: Py<PyAny>,
    stats_cls: Py<PyAny>,
}

pub fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

fn now_of(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    if let Ok(f) = obj.downcast::<PyFloat>() {
        let v = f.value();
        if v == f64::INFINITY {
            return Ok(FOREVER);
        }
        if v.is_nan() || v < -9.2e18 {
            return Ok(i64::MIN);
        }
        if v >= 9.2e18 {
            return Ok(FOREVER - 1);
        }
        return Ok(v.floor() as i64);
    }
    obj.extract::<i64>()
}

impl Matcher {
    fn guard<T>(&mut self, f: impl FnOnce(&mut Core) -> PyResult<T>) -> PyResult<T> {
        let core = &mut self.core;
        match catch_unwind(AssertUnwindSafe(|| f(core))) {
            Ok(r) => r,
            Err(p) => Err(CoreError::new_err(format!(
                "rule {}: the native matcher failed: {}",
                self.core.p.rule_id,
                panic_message(p)
            ))),
        }
    }

    fn take(state: &Option<Bound<'_, State>>) -> PyResult<Option<MState>> {
        match state {
            None => Ok(None),
            Some(s) => Ok(s.try_borrow_mut()?.inner.take()),
        }
    }

    fn give<'py>(py: Python<'py>, old: Option<Bound<'py, State>>, new: Option<MState>) -> PyResult<Py<PyAny>> {
        match (old, new) {
            (_, None) => Ok(py.None()),
            (Some(s), Some(m)) => {
                s.try_borrow_mut()?.inner = Some(m);
                Ok(s.into_any().unbind())
            }
            (None, Some(m)) => Ok(Bound::new(py, State { inner: Some(m) })?.into_any().unbind()),
        }
    }

    fn event(&self, py: Python<'_>, event: &Bound<'_, PyAny>, ts: i64, seq: Py<PyAny>) -> PyResult<Ev> {
        let vals = extract_fields(py, event, &self.core.p.fields)?;
        let ev = Ev::from_py(event.clone().unbind(), seq, ts);
        ev.set_vals(vals);
        Ok(ev)
    }
}

/// A rule's matcher core from its exported program (`cep/program.py`).
pub fn build_core(py: Python<'_>, program: &Bound<'_, PyAny>, max_partial_matches: Option<usize>) -> PyResult<Core> {
    let p = program::parse(py, program)?;
    let m = py.import("cep.runtime.matcher")?;
    let classes = Classes {
        matched_event: ResultClass::new(py, &m, "MatchedEvent")?,
        match_: ResultClass::new(py, &m, "Match")?,
        timeout: ResultClass::new(py, &m, "Timeout")?,
        dropped: m.getattr("Dropped")?.unbind(),
    };
    let d = program.downcast::<PyDict>()?;
    let version_py = program::get(d, "rule_version")?.unbind();
    let cap = max_partial_matches
        .filter(|&c| c > 0)
        .or(p.max_partial_matches.filter(|&c| c > 0))
        .unwrap_or(DEFAULT_MAX_PARTIAL_MATCHES);
    let all_matches = p.skip == SkipK::AllMatches;
    Ok(Core {
        cids: Vec::new(),
        cap,
        all_matches,
        history_free: p.history_free && !all_matches,
        want_timeouts: p.timeout_alert.is_some(),
        ops: PyOps::new(py)?,
        classes,
        rule_id_py: PyString::new(py, &p.rule_id).into_any().unbind(),
        version_py,
        emit_py: PyString::new(py, &p.emit_alert).into_any().unbind(),
        timeout_py: PyString::new(py, p.timeout_alert.as_deref().unwrap_or("")).into_any().unbind(),
        var_names: p.vars.iter().map(|v| PyString::new(py, v).into_any().unbind()).collect(),
        measure_names: p.measures.iter().map(|(n, _)| PyString::intern(py, n).unbind()).collect(),
        key_field: p.key_field.as_deref().filter(|k| !k.is_empty()).map(|k| PyString::intern(py, k).unbind()),
        stats: Stats::default(),
        spare: Vec::new(),
        pool: Default::default(),
        acts: Vec::new(),
        p,
    })
}

#[pymethods]
impl Matcher {
    #[new]
    #[pyo3(signature = (program, rule=None, max_partial_matches=None))]
    fn new(py: Python<'_>, program: &Bound<'_, PyAny>, rule: Option<Py<PyAny>>, max_partial_matches: Option<usize>) -> PyResult<Self> {
        let core = build_core(py, program, max_partial_matches)?;
        let m = py.import("cep.runtime.matcher")?;
        Ok(Matcher {
            core,
            rule: rule.unwrap_or_else(|| py.None()),
            stats_cls: m.getattr("MatcherStats")?.unbind(),
        })
    }

    #[getter]
    fn rule_id(&self) -> String {
        self.core.p.rule_id.clone()
    }

    #[getter]
    fn cap(&self) -> usize {
        self.core.cap
    }

    /// A snapshot of the counters, as `cep.runtime.MatcherStats`.
    #[getter]
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let s = self.core.stats;
        Ok(self.stats_cls.bind(py).call1((s.events, s.matches, s.timeouts, s.dropped, s.max_seen))?.unbind())
    }

    fn initial(&self, py: Python<'_>) -> Py<PyAny> {
        py.None()
    }

    #[staticmethod]
    fn is_empty(state: Option<Bound<'_, State>>) -> PyResult<bool> {
        Ok(match state {
            None => true,
            Some(s) => s.try_borrow()?.inner.is_none(),
        })
    }

    #[staticmethod]
    fn next_deadline(state: Option<Bound<'_, State>>) -> PyResult<Option<i64>> {
        Ok(match state {
            None => None,
            Some(s) => s.try_borrow()?.inner.as_ref().and_then(|m| m.deadline),
        })
    }

    #[staticmethod]
    fn partial_count(state: Option<Bound<'_, State>>) -> PyResult<usize> {
        Ok(match state {
            None => 0,
            Some(s) => s.try_borrow()?.__len__(),
        })
    }

    #[pyo3(signature = (state, event, ts, seq=None, key=None, pre=None))]
    #[allow(clippy::too_many_arguments)]
    fn on_event<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, State>>,
        event: &Bound<'py, PyAny>,
        ts: i64,
        seq: Option<Py<PyAny>>,
        key: Option<Py<PyAny>>,
        pre: Option<Bound<'py, PyAny>>,
    ) -> PyResult<(Py<PyAny>, Bound<'py, PyList>)> {
        let seq = match seq {
            Some(s) => s,
            None => 0i64.into_pyobject(py)?.into_any().unbind(),
        };
        let ev = self.event(py, event, ts, seq)?;
        let pre = match pre {
            None => None,
            Some(p) => {
                let mut v = Vec::new();
                for x in p.try_iter()? {
                    let x = x?;
                    v.push(if x.is_none() { None } else { Some(x.is_truthy()?) });
                }
                Some(v)
            }
        };
        let out = Out::new(PyList::empty(py), key.filter(|k| !k.is_none(py)));
        let st = Self::take(&state)?;
        let new = self.guard(|core| core.feed(py, st, &ev, pre, &mut [], &out))?;
        Ok((Self::give(py, state, new)?, out.list))
    }

    /// `on_event` for each `(ts, seq, event)` of `items`, results appended to `out`.
    fn on_events<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, State>>,
        items: &Bound<'py, PyAny>,
        key: Option<Py<PyAny>>,
        out: Bound<'py, PyList>,
    ) -> PyResult<Py<PyAny>> {
        let mut evs = Vec::new();
        for item in items.try_iter()? {
            let item = item?;
            let t = item.downcast::<PyTuple>()?;
            let ts: i64 = t.get_item(0)?.extract()?;
            let seq = t.get_item(1)?.unbind();
            evs.push(self.event(py, &t.get_item(2)?, ts, seq)?);
        }
        let o = Out::new(out, key.filter(|k| !k.is_none(py)));
        let mut st = Self::take(&state)?;
        let r = self.guard(|core| {
            for ev in evs {
                st = core.feed(py, st.take(), &ev, None, &mut [], &o)?;
            }
            Ok(st.take())
        });
        let new = r?;
        Self::give(py, state, new)
    }

    #[pyo3(signature = (state, now, key=None))]
    fn on_time<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, State>>,
        now: &Bound<'py, PyAny>,
        key: Option<Py<PyAny>>,
    ) -> PyResult<(Py<PyAny>, Bound<'py, PyList>)> {
        let now = now_of(now)?;
        let out = Out::new(PyList::empty(py), key.filter(|k| !k.is_none(py)));
        let due = match &state {
            None => false,
            Some(s) => s.try_borrow()?.inner.as_ref().and_then(|m| m.deadline).is_some_and(|d| d <= now),
        };
        if !due {
            let same = match state {
                None => py.None(),
                Some(s) => {
                    if s.try_borrow()?.inner.is_none() {
                        py.None()
                    } else {
                        s.into_any().unbind()
                    }
                }
            };
            return Ok((same, out.list));
        }
        let st = Self::take(&state)?;
        let new = self.guard(|core| match st {
            None => Ok(None),
            Some(s) => core.advance(py, s, now, &out),
        })?;
        Ok((Self::give(py, state, new)?, out.list))
    }

    #[pyo3(signature = (state, key=None))]
    fn flush<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, State>>,
        key: Option<Py<PyAny>>,
    ) -> PyResult<(Py<PyAny>, Bound<'py, PyList>)> {
        let out = Out::new(PyList::empty(py), key.filter(|k| !k.is_none(py)));
        let st = Self::take(&state)?;
        self.guard(|core| match st {
            None => Ok(()),
            Some(s) => core.advance(py, s, FOREVER, &out).map(|_| ()),
        })?;
        Ok((py.None(), out.list))
    }

    #[pyo3(signature = (state, key=None))]
    fn on_end<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, State>>,
        key: Option<Py<PyAny>>,
    ) -> PyResult<(Py<PyAny>, Bound<'py, PyList>)> {
        let out = Out::new(PyList::empty(py), key.filter(|k| !k.is_none(py)));
        let st = Self::take(&state)?;
        self.guard(|core| match st {
            None => Ok(()),
            Some(s) => core.on_end(py, s, &out),
        })?;
        Ok((py.None(), out.list))
    }
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tune_allocator();
    m.add_class::<Matcher>()?;
    m.add_class::<State>()?;
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::EngineState>()?;
    m.add_function(wrap_pyfunction!(state_from_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(rule_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(validate::validate_fast, m)?)?;
    m.add_function(wrap_pyfunction!(validate::content_seq_of, m)?)?;
    m.add_function(wrap_pyfunction!(validate::spark_shards, m)?)?;
    m.add("CoreError", m.py().get_type::<CoreError>())?;
    m.add("Unsupported", m.py().get_type::<Unsupported>())?;
    m.add("PROGRAM_VERSION", program::VERSION)?;
    m.add("STATE_VERSION", state::VERSION)?;
    m.add("KEY_STATE_VERSION", engine::KEY_VERSION)?;
    m.add("BLOB_VERSION", engine::BLOB_VERSION)?;
    Ok(())
}
