//! The matcher: `cep/runtime/matcher.py` step for step (that file is the specification).
//!
//! A key's state is `MState`: the next row number, the runs (one per start row, entries in
//! preference order) and the earliest deadline. Entry position `DONE` is a complete match
//! waiting for more preferred alternatives to be decided.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule, PyString, PyTuple};

use crate::expr::{Cap, CapVec, Caps, Cx, Ev, RowMemo, NO_CAPS};
use crate::program::{Conn, Program, SkipK, DONE};
use crate::value::{PyOps, Value};

pub const FOREVER: i64 = i64::MAX;

#[derive(Clone)]
pub struct Entry {
    pub pos: i32,
    pub caps: Caps,
}

#[derive(Clone)]
pub struct Run {
    pub start: i64,
    pub entries: Vec<Entry>,
    pub tpart: Option<Caps>,
    pub matched: bool,
}

#[derive(Clone, Default)]
pub struct MState {
    pub row: i64,
    pub runs: Vec<Run>,
    pub deadline: Option<i64>,
}

impl MState {
    /// Give back the spare room of the state's vectors (runs, entries, captures held by no other
    /// entry): a key at rest between calls then holds only what it uses (docs/native-core.md,
    /// "Compact key state (session 14)"). Vectors from the pool or grown by doubling keep up to
    /// 4-8x their length otherwise.
    pub fn compact(&mut self) {
        fit(&mut self.runs);
        for r in &mut self.runs {
            fit(&mut r.entries);
            for e in &mut r.entries {
                compact_caps(&mut e.caps);
            }
            if let Some(t) = &mut r.tpart {
                compact_caps(t);
            }
        }
    }
}

/// `c`'s vectors without spare room, when nothing else holds them (shared captures are left
/// as they are: copying them would cost more than their room).
fn compact_caps(c: &mut Caps) {
    if c.v.capacity() == c.v.len() && c.acc.capacity() == c.acc.len() {
        return;
    }
    if Caps::strong_count(c) == 1 {
        if let Some(v) = Caps::get_mut(c) {
            fit(&mut v.v);
            fit(&mut v.acc);
        }
    }
}

/// `v` in a block of its length (none when empty; its elements moved in order, the old block
/// freed). Not `shrink_to_fit`: that is a `realloc`, which mimalloc answers in place, keeping
/// the whole block, while the length takes at least half of it (26-29 MB at 1M cards,
/// docs/native-core.md "Many keys: compaction into blocks of the length (session 17)").
pub(crate) fn fit<T>(v: &mut Vec<T>) {
    if v.capacity() > v.len() {
        let mut exact = Vec::with_capacity(v.len());
        exact.append(v);
        *v = exact;
    }
}

#[derive(Default, Clone, Copy)]
pub struct Stats {
    pub events: u64,
    pub matches: u64,
    pub timeouts: u64,
    pub dropped: u64,
    pub max_seen: u64,
}

/// Python classes results are built from.
pub struct Classes {
    pub matched_event: ResultClass,
    pub match_: ResultClass,
    pub timeout: ResultClass,
    pub dropped: Py<PyAny>,
}

/// A result class and, when calling it only sets its fields from its arguments, their names
/// (`plain_fields` in cep/runtime/matcher.py decides; docs/native-core.md, session 21, gc21).
pub struct ResultClass {
    pub cls: Py<PyAny>,
    pub fields: Option<Vec<Py<PyString>>>,
}

impl ResultClass {
    pub fn new(py: Python<'_>, m: &Bound<'_, PyModule>, name: &str) -> PyResult<Self> {
        let cls = m.getattr(name)?;
        let fields: Option<Vec<String>> = m.getattr("plain_fields")?.call1((&cls,))?.extract()?;
        let fields = fields.map(|f| f.iter().map(|n| PyString::intern(py, n).unbind()).collect());
        Ok(ResultClass { cls: cls.unbind(), fields })
    }

    /// An instance from `vals` (the fields in order): made and its fields set as the
    /// dataclass's generated `__init__` sets them (`object.__setattr__`, i.e.
    /// `PyObject_GenericSetAttr`, per field) without running that Python code, when the class
    /// is plain; else the class called.
    pub fn make<'py>(&self, py: Python<'py>, vals: &[Bound<'py, PyAny>]) -> PyResult<Bound<'py, PyAny>> {
        let Some(names) = self.fields.as_ref().filter(|n| n.len() == vals.len()) else {
            return self.cls.bind(py).call1(PyTuple::new(py, vals)?);
        };
        let empty = PyTuple::empty(py);
        // SAFETY: `cls` is a type (a dataclass, checked by `plain_fields`) whose `__new__` is
        // `object.__new__`; the pointers are live, owned by `py`-bound references.
        let obj = unsafe {
            let tp = self.cls.as_ptr().cast::<ffi::PyTypeObject>();
            Bound::from_owned_ptr_or_err(py, ffi::PyType_GenericNew(tp, empty.as_ptr(), std::ptr::null_mut()))?
        };
        for (n, v) in names.iter().zip(vals) {
            // SAFETY: as above; a failure sets the Python error fetched here.
            if unsafe { ffi::PyObject_GenericSetAttr(obj.as_ptr(), n.as_ptr(), v.as_ptr()) } < 0 {
                return Err(PyErr::fetch(py));
            }
        }
        Ok(obj)
    }
}

/// No shared condition (`Core::cids`).
pub const NO_CID: u32 = u32::MAX;

/// The local conditions known for the current event: this rule's (`own`, per variable) and
/// those shared by the engine's rules (`shared`, per distinct condition: 0 unknown, 1 false,
/// 2 true; empty outside the engine).
pub struct Loc<'a> {
    pub(crate) own: &'a mut [Option<bool>],
    pub(crate) shared: &'a mut [u8],
    /// The memoised values for this event: the aggregates' rows and `Expr::Local`s (`Cx::rows`).
    pub(crate) rows: &'a [RowMemo],
}

pub struct Core {
    pub p: Program,
    /// Per variable, the engine's id of its local condition among the distinct conditions of
    /// the rule's group (`NO_CID`: none, or not local); empty for a matcher outside the engine.
    pub cids: Vec<u32>,
    pub cap: usize,
    pub all_matches: bool,
    pub history_free: bool,
    pub want_timeouts: bool,
    pub ops: PyOps,
    pub classes: Classes,
    pub rule_id_py: Py<PyAny>,
    pub version_py: Py<PyAny>,
    pub emit_py: Py<PyAny>,
    pub timeout_py: Py<PyAny>,
    pub var_names: Vec<Py<PyAny>>,
    pub measure_names: Vec<Py<PyString>>,
    pub key_field: Option<Py<PyString>>,
    pub stats: Stats,
    /// A spare entry vector for `step` (kept between events: no allocation per step).
    pub spare: Vec<Entry>,
    /// `step`'s decisions per entry (kept between events).
    pub acts: Vec<Act>,
    /// The vectors of ended runs, for the runs `spawn` starts.
    pub pool: Pool,
}

/// Vectors of ended runs kept for new ones (fraud starts a run at most events and ends one as
/// often): entry vectors, and capture vectors held by no one else, emptied when reused (the `Arc`
/// and its vector reused: no allocation for a run's start). At most `POOL` of each; entry vectors
/// of up to 8, capture vectors of up to `POOL_CAPS` (a trading run's ~30 captures then grow in
/// a reused vector, not from four by doubling, docs/native-core.md session 26).
#[derive(Default)]
pub struct Pool {
    entries: Vec<Vec<Entry>>,
    caps: Vec<Caps>,
}

const POOL: usize = 32;
const POOL_CAPS: usize = 64;

impl Pool {
    /// Keep `c` if nothing else holds it (else it is just dropped): by its count alone, a
    /// plain load (no `Weak` of captures is ever made). It is emptied when reused (`caps_of`,
    /// whose `get_mut` is a load of the count too: `Caps` is a `triomphe::Arc`).
    pub(crate) fn put_caps(&mut self, c: Caps) {
        if self.caps.len() < POOL && Caps::strong_count(&c) == 1 && c.v.capacity() <= POOL_CAPS {
            self.caps.push(c);
        }
    }

    /// Keep the captures of `entries[from..]`, which are removed (just dropped when the pool
    /// is full: no count read per entry then).
    fn put_tail(&mut self, entries: &mut Vec<Entry>, from: usize) {
        if self.caps.len() >= POOL {
            entries.truncate(from);
            return;
        }
        // From the last (no `Drain`; which vector the pool gives next does not matter).
        while entries.len() > from {
            if let Some(e) = entries.pop() {
                self.put_caps(e.caps);
            }
        }
    }

    /// Keep an ended run's entry vector, and its entries' captures.
    fn put_entries(&mut self, mut e: Vec<Entry>) {
        self.put_tail(&mut e, 0);
        if self.entries.len() < POOL && (1..=8).contains(&e.capacity()) {
            self.entries.push(e);
        }
    }

    /// Captures holding `cap` alone (a kept vector, or a new one with room for four), `fold`
    /// applied to them before they are shared.
    pub(crate) fn caps_of(&mut self, cap: Cap, fold: impl FnOnce(&mut CapVec)) -> Caps {
        if let Some(mut c) = self.caps.pop() {
            if let Some(v) = Caps::get_mut(&mut c) {
                v.v.clear();
                v.acc.clear();
                v.v.push(cap);
                fold(v);
                return c;
            }
        }
        let mut v = Vec::with_capacity(4);
        v.push(cap);
        let mut c = CapVec::from(v);
        fold(&mut c);
        Caps::new(c)
    }
}

/// What `step` does with an entry: its tests are all made first (in order), then the entries
/// that end are dropped before the others grow, so a capture vector that a dropped entry
/// shared is grown in place, not copied.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Act {
    /// Kept as it is (a complete match waiting).
    Keep,
    /// Ends here.
    Drop,
    /// Moves to its state's `after` position with the same captures.
    After,
    /// An absence that completes.
    Done,
    /// Takes the event (captures grown, one entry per next state); `also_after`: and stays
    /// (ANY contiguity: the event may be skipped as well).
    Grow { also_after: bool },
}

/// Results of one call, and the key they are reported under.
pub struct Out<'py> {
    pub list: Bound<'py, PyList>,
    key: Option<Py<PyAny>>,
    /// The engine's key as text: made a Python str only when a result needs it. Borrowed
    /// from the caller's key (no reference count written per due key).
    key_text: Option<&'py str>,
    key_cell: std::cell::OnceCell<Py<PyAny>>,
}

impl<'py> Out<'py> {
    pub fn new(list: Bound<'py, PyList>, key: Option<Py<PyAny>>) -> Self {
        Out { list, key, key_text: None, key_cell: std::cell::OnceCell::new() }
    }

    /// Results reported under `key` (a str, built on first use).
    pub fn lazy(list: Bound<'py, PyList>, key: &'py str) -> Self {
        Out { list, key: None, key_text: Some(key), key_cell: std::cell::OnceCell::new() }
    }
}

/// One entry per next position `next`, all sharing `caps` (moved into the last: one reference
/// count less per step than cloning it for each), made by `entry` (family.rs's carry a mask).
pub(crate) fn push_next<E>(out: &mut Vec<E>, next: &[i32], caps: Caps, entry: impl Fn(i32, Caps) -> E) {
    if let Some((&last, rest)) = next.split_last() {
        for &t in rest {
            out.push(entry(t, caps.clone()));
        }
        out.push(entry(last, caps));
    }
}

/// `caps` with `cap` appended, in a new vector (the running aggregates copied).
fn grown_caps(caps: &CapVec, cap: Cap) -> CapVec {
    let mut grown = Vec::with_capacity(caps.len() + 1);
    grown.extend(caps.iter().cloned());
    grown.push(cap);
    CapVec { v: grown, acc: caps.acc.clone() }
}

impl Core {
    pub(crate) fn cx<'a, 'py>(&'a self, py: Python<'py>, rows: &'a [RowMemo]) -> Cx<'a, 'py> {
        Cx { py, ops: &self.ops, fields: &self.p.fields, aggs: &self.p.aggs, rows }
    }

    // ------------------------------------------------------------------ stepping

    /// Whether `var`'s condition holds for `ev` after `caps`: a local condition already known
    /// for this event is answered in line (half the tests of a trading tick), else `test_cond`.
    #[inline]
    pub(crate) fn test(&self, py: Python<'_>, var: usize, ev: &Ev, caps: &CapVec, local: &mut Loc<'_>) -> PyResult<bool> {
        if self.p.local[var] && self.p.conds[var].is_some() {
            if let Some(v) = local.own[var] {
                return Ok(v);
            }
        }
        self.test_cond(py, var, ev, caps, local)
    }

    #[inline(never)]
    fn test_cond(&self, py: Python<'_>, var: usize, ev: &Ev, caps: &CapVec, local: &mut Loc<'_>) -> PyResult<bool> {
        let Some(cond) = &self.p.conds[var] else { return Ok(true) };
        if self.p.local[var] {
            if let Some(v) = local.own[var] {
                return Ok(v);
            }
            // A condition that another rule of the engine shares (`cids`) may be known already.
            let cid = self.cids.get(var).copied().unwrap_or(NO_CID) as usize;
            if let Some(&known) = local.shared.get(cid) {
                if known != 0 {
                    let v = known == 2;
                    local.own[var] = Some(v);
                    return Ok(v);
                }
            }
            let v = cond.holds(&self.cx(py, local.rows), ev, caps)?;
            local.own[var] = Some(v);
            if let Some(slot) = local.shared.get_mut(cid) {
                *slot = 1 + v as u8;
            }
            return Ok(v);
        }
        cond.holds(&self.cx(py, local.rows), ev, caps)
    }

    fn any(&self, py: Python<'_>, vars: &[usize], ev: &Ev, caps: &CapVec, local: &mut Loc<'_>) -> PyResult<bool> {
        for &g in vars {
            if self.test(py, g, ev, caps, local)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// `f` given the pool taken out of `self` (put back after, also when `f` fails).
    fn with_pool<T>(&mut self, f: impl FnOnce(&Self, &mut Pool) -> T) -> T {
        let mut pool = std::mem::take(&mut self.pool);
        let r = f(self, &mut pool);
        self.pool = pool;
        r
    }

    fn spawn(
        &self,
        py: Python<'_>,
        ev: &Ev,
        row: i64,
        local: &mut Loc<'_>,
        pool: &mut Pool,
    ) -> PyResult<Vec<Entry>> {
        let mut out = Vec::new();
        for (var, nxt) in &self.p.starts {
            if self.test(py, *var, ev, &NO_CAPS, local)? {
                if out.capacity() == 0 {
                    out = pool.entries.pop().unwrap_or_default();
                }
                let cap = Cap { var: *var as u32, row, ev: ev.clone() };
                let caps = pool.caps_of(cap, |c| c.fold_last(&self.cx(py, local.rows)));
                push_next(&mut out, nxt, caps, |pos, caps| Entry { pos, caps });
            }
        }
        Ok(out)
    }

    /// Steps `entries` over one event, in place: the stepped entries are built in `spare`
    /// and swapped in (the two vectors' buffers are reused from event to event). Every test is
    /// made first, in the entries' order (`decide_step`); then the entries that end are dropped
    /// and the others built, so captures shared only with an ending entry grow in place.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        py: Python<'_>,
        entries: &mut Vec<Entry>,
        spare: &mut Vec<Entry>,
        acts: &mut Vec<Act>,
        ev: &Ev,
        row: i64,
        local: &mut Loc<'_>,
        pool: &mut Pool,
    ) -> PyResult<()> {
        acts.clear();
        for entry in entries.iter() {
            acts.push(self.decide_step(py, entry, ev, local)?);
        }
        // The entries that end are dropped (one pass over both vectors, order kept).
        let mut w = 0;
        for i in 0..entries.len() {
            if acts[i] != Act::Drop {
                entries.swap(w, i);
                acts[w] = acts[i];
                w += 1;
            }
        }
        pool.put_tail(entries, w);
        acts.truncate(w);
        let mut out = std::mem::take(spare);
        out.clear();
        out.reserve(entries.len());
        for (Entry { pos, caps }, &act) in entries.drain(..).zip(acts.iter()) {
            match act {
                Act::Keep => out.push(Entry { pos, caps }),
                Act::Drop => {}
                Act::Done => out.push(Entry { pos: DONE, caps }),
                Act::After => out.push(Entry { pos: self.p.table[pos as usize].after, caps }),
                Act::Grow { also_after } => {
                    let st = &self.p.table[pos as usize];
                    let cap = Cap { var: st.var as u32, row, ev: ev.clone() };
                    if also_after {
                        push_next(&mut out, &st.next, Caps::new(self.grown(py, &caps, cap, local)), |pos, caps| Entry { pos, caps });
                        out.push(Entry { pos: st.after, caps });
                        continue;
                    }
                    // The entry itself does not go on: its captures are grown in place when no
                    // other entry shares them (copy on write), else copied.
                    let mut c = caps;
                    let grown: Caps = match Caps::get_mut(&mut c) {
                        Some(v) => {
                            v.v.push(cap);
                            v.fold_last(&self.cx(py, local.rows));
                            c
                        }
                        None => Caps::new(self.grown(py, &c, cap, local)),
                    };
                    push_next(&mut out, &st.next, grown, |pos, caps| Entry { pos, caps });
                }
            }
        }
        *spare = std::mem::replace(entries, out);
        Ok(())
    }

    /// `caps` with `cap` appended, in a new vector, its aggregates folded.
    pub(crate) fn grown(&self, py: Python<'_>, caps: &CapVec, cap: Cap, local: &Loc<'_>) -> CapVec {
        let mut g = grown_caps(caps, cap);
        g.fold_last(&self.cx(py, local.rows));
        g
    }

    /// The tests of `_step` for one entry, in its order, and what becomes of the entry.
    fn decide_step(&self, py: Python<'_>, entry: &Entry, ev: &Ev, local: &mut Loc<'_>) -> PyResult<Act> {
        if entry.pos == DONE {
            return Ok(Act::Keep);
        }
        let st = &self.p.table[entry.pos as usize];
        if !st.not_next.is_empty() && self.any(py, &st.not_next, ev, &entry.caps, local)? {
            return Ok(Act::Drop);
        }
        if st.absence {
            if st.not_followed.is_empty() {
                return Ok(Act::Done);
            }
            return Ok(if self.any(py, &st.not_followed, ev, &entry.caps, local)? { Act::Drop } else { Act::After });
        }
        let taken = self.test(py, st.var, ev, &entry.caps, local)?;
        if taken && st.conn != Conn::Any {
            return Ok(Act::Grow { also_after: false });
        }
        if !taken && st.conn == Conn::Strict {
            return Ok(Act::Drop);
        }
        if !st.not_followed.is_empty() && self.any(py, &st.not_followed, ev, &entry.caps, local)? {
            return Ok(if taken { Act::Grow { also_after: false } } else { Act::Drop });
        }
        Ok(if taken { Act::Grow { also_after: true } } else { Act::After })
    }

    /// `_feed`: one event of this key.
    #[allow(clippy::too_many_arguments)]
    pub fn feed(
        &mut self,
        py: Python<'_>,
        state: Option<MState>,
        ev: &Ev,
        pre: Option<Vec<Option<bool>>>,
        shared: &mut [u8],
        out: &Out,
    ) -> PyResult<Option<MState>> {
        self.stats.events += 1;
        let ts = ev.ts;
        let mut state = state;
        if let Some(s) = &state {
            if s.deadline.is_some_and(|d| d < ts) {
                let s = state.take().unwrap_or_default();
                // No deadline computed here: every path below ends in the `settle` at the end
                // of `feed`, which finds it (a new early return must compute it, or call
                // `advance`).
                state = self.advance_to(py, s, ts - 1, out, false)?;
            }
        }
        // The cache of local conditions: on the stack for up to 8 variables (no allocation
        // per event and rule).
        let nvars = self.p.vars.len();
        let mut stack = [None; 8];
        let mut heap: Vec<Option<bool>>;
        let own: &mut [Option<bool>] = match pre {
            Some(p) if p.len() == nvars => {
                heap = p;
                &mut heap
            }
            _ if nvars <= stack.len() => &mut stack[..nvars],
            _ => {
                heap = vec![None; nvars];
                &mut heap
            }
        };
        // The row values of the condition aggregates for this event, shared by the partial
        // matches that fold or read them: on the stack for up to 8 aggregates (none made, nor
        // dropped, for a rule without any: most rules, every event).
        let nslots = self.p.nmemo;
        let memo_stack: [RowMemo; 8];
        let memo_heap: Vec<RowMemo>;
        let rows: &[RowMemo] = if nslots == 0 {
            &[]
        } else if nslots <= 8 {
            memo_stack = Default::default();
            &memo_stack[..nslots]
        } else {
            memo_heap = (0..nslots).map(|_| RowMemo::new()).collect();
            &memo_heap
        };
        let local = &mut Loc { own, shared, rows };
        let (row, runs) = match state {
            None => {
                let spawned = self.with_pool(|m, pool| m.spawn(py, ev, 0, local, pool))?;
                if spawned.is_empty() {
                    return Ok(None);
                }
                (0, vec![Run { start: 0, entries: spawned, tpart: None, matched: false }])
            }
            Some(mut s) => {
                let row = s.row;
                // The runs are stepped in place (no new vectors per event).
                let mut spare = std::mem::take(&mut self.spare);
                let mut acts = std::mem::take(&mut self.acts);
                let spawned = self.with_pool(|m, pool| {
                    for r in s.runs.iter_mut() {
                        m.step(py, &mut r.entries, &mut spare, &mut acts, ev, row, local, pool)?;
                    }
                    m.spawn(py, ev, row, local, pool)
                });
                self.spare = spare;
                self.acts = acts;
                let spawned = spawned?;
                if !spawned.is_empty() {
                    s.runs.push(Run { start: row, entries: spawned, tpart: None, matched: false });
                }
                (row, s.runs)
            }
        };
        self.settle(py, row + 1, runs, out, Some(ts))
    }

    // ------------------------------------------------------------------ time

    pub fn deadline(&self, caps: &[Cap]) -> Option<i64> {
        self.deadline_at(|| caps[0].ev.ts, || caps[caps.len() - 1].ev.ts)
    }

    /// The deadline of an entry whose first and last captured events have the times `first`
    /// and `last` give (read only when the rule has WITHIN, resp. STEP WITHIN): the earlier of
    /// WITHIN from the first and STEP WITHIN from the last (`deadline`; `pack.rs` reads the
    /// times off a packed key's words).
    #[inline(always)]
    pub fn deadline_at(&self, first: impl FnOnce() -> i64, last: impl FnOnce() -> i64) -> Option<i64> {
        let mut d = None;
        if let Some(w) = self.p.within {
            d = Some(first().saturating_add(w));
        }
        if let Some(s) = self.p.step {
            let s = last().saturating_add(s);
            d = Some(match d {
                Some(x) if x <= s => x,
                _ => s,
            });
        }
        d
    }

    pub fn advance(&mut self, py: Python<'_>, state: MState, now: i64, out: &Out) -> PyResult<Option<MState>> {
        self.advance_to(py, state, now, out, true)
    }

    /// `advance`; the state's next deadline is left None unless `deadline` (`feed` advances
    /// before the event and its `settle` finds the deadline after it).
    fn advance_to(&mut self, py: Python<'_>, state: MState, now: i64, out: &Out, deadline: bool) -> PyResult<Option<MState>> {
        let flushing = now == FOREVER;
        let mut state = state;
        // In place: the entries a deadline ends are removed from their run's vector (no new
        // vectors per run and call).
        for r in state.runs.iter_mut() {
            // Without STEP WITHIN every entry of a run has the run's deadline (WITHIN from its
            // first capture, the start row's): a run whose deadline is not reached is left as
            // it is without visiting its entries.
            if !flushing && self.p.step.is_none() {
                if let Some(e) = r.entries.first() {
                    if self.deadline(&e.caps).is_none_or(|d| d > now) {
                        continue;
                    }
                }
            }
            let mut tpart = r.tpart.take();
            let entries = &mut r.entries;
            let mut w = 0;
            for i in 0..entries.len() {
                let pos = entries[i].pos;
                let to = if pos == DONE {
                    Some(DONE)
                } else {
                    let absence = self.p.table[pos as usize].absence;
                    match self.deadline(&entries[i].caps) {
                        None if flushing => absence.then_some(DONE),
                        None => Some(pos),
                        Some(d) if d <= now => {
                            if !absence
                                && self.want_timeouts
                                && tpart.as_ref().is_none_or(|t| entries[i].caps.len() > t.len())
                            {
                                tpart = Some(entries[i].caps.clone());
                            }
                            absence.then_some(DONE)
                        }
                        Some(_) => Some(pos),
                    }
                };
                if let Some(to) = to {
                    entries[i].pos = to;
                    entries.swap(w, i);
                    w += 1;
                }
            }
            self.pool.put_tail(entries, w);
            r.tpart = tpart;
        }
        self.settle_to(py, state.row, state.runs, out, None, deadline)
    }

    pub fn on_end(&mut self, py: Python<'_>, state: MState, out: &Out) -> PyResult<()> {
        let mut runs = Vec::with_capacity(state.runs.len());
        for r in state.runs {
            let mut kept = Vec::new();
            for entry in r.entries {
                if entry.pos == DONE {
                    kept.push(entry);
                } else if self.p.table[entry.pos as usize].absence && self.deadline(&entry.caps).is_none() {
                    kept.push(Entry { pos: DONE, caps: entry.caps });
                }
            }
            // A partial match already cut off by time stays its start row's timeout unless
            // that row completes a match here (the Python spec's on_end does the same).
            runs.push(Run { start: r.start, entries: kept, tpart: r.tpart, matched: r.matched });
        }
        self.settle(py, state.row, runs, out, None)?;
        Ok(())
    }

    // ------------------------------------------------------------------ deciding

    fn settle(&mut self, py: Python<'_>, row: i64, runs: Vec<Run>, out: &Out, ts: Option<i64>) -> PyResult<Option<MState>> {
        self.settle_to(py, row, runs, out, ts, true)
    }

    /// `settle`, the next deadline found only when `deadline` (else None).
    fn settle_to(&mut self, py: Python<'_>, row: i64, runs: Vec<Run>, out: &Out, ts: Option<i64>, deadline: bool) -> PyResult<Option<MState>> {
        let mut runs = runs;
        for r in runs.iter_mut() {
            self.prune(r);
        }
        let mut runs = self.decide(py, runs, out)?;
        let total: usize = runs.iter().map(|r| r.entries.len()).sum();
        if total as u64 > self.stats.max_seen {
            self.stats.max_seen = total as u64;
        }
        if total > self.cap {
            runs = self.drop_oldest(py, runs, total, out, ts)?;
            runs = self.decide(py, runs, out)?;
        }
        if runs.is_empty() {
            return Ok(None);
        }
        if !deadline {
            return Ok(Some(MState { row, runs, deadline: None }));
        }
        let mut deadline: Option<i64> = None;
        for r in &runs {
            for e in &r.entries {
                if e.pos != DONE {
                    if let Some(d) = self.deadline(&e.caps) {
                        if deadline.is_none_or(|x| d < x) {
                            deadline = Some(d);
                        }
                    }
                    if self.p.step.is_none() {
                        break; // the run's other entries share its first capture (`advance`)
                    }
                }
            }
        }
        Ok(Some(MState { row, runs, deadline }))
    }

    /// Whether `a` and `b` are the same partial match for pruning (`_prune`'s key): the same
    /// position and, unless the rule is history-free, the same (row, variable) captures; with
    /// STEP WITHIN, history-free entries also need the same last row.
    fn same(&self, a: &Entry, b: &Entry) -> bool {
        self.same_key(a.pos, &a.caps, b.pos, &b.caps)
    }

    /// `same` on (position, captures) pairs (rule families keep entries of their own).
    pub(crate) fn same_key(&self, apos: i32, a: &[Cap], bpos: i32, b: &[Cap]) -> bool {
        if apos != bpos {
            return false;
        }
        if apos != DONE && self.history_free {
            return self.p.step.is_none() || a[a.len() - 1].row == b[b.len() - 1].row;
        }
        a.len() == b.len() && a.iter().zip(b.iter()).all(|(x, y)| x.row == y.row && x.var == y.var)
    }

    fn prune(&self, run: &mut Run) {
        if run.entries.len() < 2 {
            return;
        }
        // Runs hold a handful of entries: a linear scan over the kept ones (no hashing, no
        // key vectors), in place: the kept entries are moved to the front, in order.
        let entries = &mut run.entries;
        let mut w = 0;
        for i in 0..entries.len() {
            let done = entries[i].pos == DONE && !self.all_matches;
            if done || !entries[..w].iter().any(|k| self.same(k, &entries[i])) {
                if w != i {
                    entries.swap(w, i);
                }
                w += 1;
            }
            if done {
                break;
            }
        }
        entries.truncate(w);
    }

    fn decide(&mut self, py: Python<'_>, runs: Vec<Run>, out: &Out) -> PyResult<Vec<Run>> {
        if self.all_matches {
            return self.decide_all(py, runs, out);
        }
        // Nothing to decide (the common case): the oldest run is still open and every other
        // run is kept as it is, so the runs stay as they are (no new vector).
        if runs.first().is_some_and(|r| r.entries.first().is_some_and(|e| e.pos != DONE))
            && runs[1..].iter().all(|r| !r.entries.is_empty() || r.tpart.is_some())
        {
            return Ok(runs);
        }
        // In place: the kept runs are moved to the front, in order.
        let mut runs = runs;
        let mut floor = -1i64;
        let mut head = true;
        let mut w = 0;
        for i in 0..runs.len() {
            let run = &runs[i];
            let keep = if run.start < floor {
                false
            } else if !head {
                !run.entries.is_empty() || run.tpart.is_some()
            } else if run.entries.is_empty() {
                if let Some(t) = &run.tpart {
                    self.emit_timeout(py, t, out)?;
                }
                false
            } else if run.entries[0].pos == DONE {
                let caps = &run.entries[0].caps;
                self.emit_match(py, caps, out)?;
                floor = self.resume(caps);
                false
            } else {
                head = false;
                true
            };
            if keep {
                runs.swap(w, i);
                w += 1;
            }
        }
        for r in runs.drain(w..) {
            self.pool.put_entries(r.entries);
            if let Some(t) = r.tpart {
                self.pool.put_caps(t);
            }
        }
        Ok(runs)
    }

    fn decide_all(&mut self, py: Python<'_>, runs: Vec<Run>, out: &Out) -> PyResult<Vec<Run>> {
        // No complete match and no run without live entries: nothing changes.
        if runs.iter().all(|r| !r.entries.is_empty() && r.entries.iter().all(|e| e.pos != DONE)) {
            return Ok(runs);
        }
        let mut kept = Vec::with_capacity(runs.len());
        for run in runs {
            let mut matched = run.matched;
            let mut live = Vec::with_capacity(run.entries.len());
            for entry in run.entries {
                if entry.pos == DONE {
                    self.emit_match(py, &entry.caps, out)?;
                    matched = true;
                } else {
                    live.push(entry);
                }
            }
            if !live.is_empty() {
                kept.push(Run { start: run.start, entries: live, tpart: run.tpart, matched });
            } else if let Some(t) = &run.tpart {
                if !matched {
                    self.emit_timeout(py, t, out)?;
                }
            }
        }
        Ok(kept)
    }

    pub(crate) fn resume(&self, caps: &[Cap]) -> i64 {
        let start = caps[0].row;
        match self.p.skip {
            SkipK::PastLastRow => caps[caps.len() - 1].row + 1,
            SkipK::ToNextRow | SkipK::AllMatches => start + 1,
            SkipK::ToFirst | SkipK::ToLast => {
                let var = self.p.skip_var;
                let target = if self.p.skip == SkipK::ToFirst {
                    caps.iter().find(|c| Some(c.var) == var).map(|c| c.row)
                } else {
                    caps.iter().rev().find(|c| Some(c.var) == var).map(|c| c.row)
                };
                match target {
                    None => start + 1,
                    Some(t) if t > start => t,
                    Some(_) => start + 1,
                }
            }
        }
    }

    fn drop_oldest(&mut self, py: Python<'_>, mut runs: Vec<Run>, mut total: usize, out: &Out, ts: Option<i64>) -> PyResult<Vec<Run>> {
        let mut dropped = 0usize;
        while total > self.cap && runs.len() > 1 {
            let n = runs[0].entries.len();
            runs.remove(0);
            total -= n;
            dropped += n;
        }
        if total > self.cap {
            let r = &mut runs[0];
            dropped += r.entries.len() - self.cap;
            r.entries.truncate(self.cap);
        }
        let mut key = py.None();
        for r in &runs {
            if let Some(e) = r.entries.first() {
                key = self.key(py, &e.caps, out)?;
                break;
            }
        }
        self.emit_dropped(py, key, dropped, ts, out)?;
        Ok(runs)
    }

    /// The `Dropped` result for `dropped` partial matches (a rule family's too, `family.rs`).
    pub(crate) fn emit_dropped(&mut self, py: Python<'_>, key: Py<PyAny>, dropped: usize, ts: Option<i64>, out: &Out) -> PyResult<()> {
        self.stats.dropped += dropped as u64;
        let d = self.classes.dropped.bind(py).call1((
            self.rule_id_py.clone_ref(py),
            self.version_py.clone_ref(py),
            key,
            dropped,
            ts.unwrap_or(0),
        ))?;
        out.list.append(d)
    }

    // ------------------------------------------------------------------ results

    pub(crate) fn key(&self, py: Python<'_>, caps: &[Cap], out: &Out) -> PyResult<Py<PyAny>> {
        if let Some(k) = &out.key {
            return Ok(k.clone_ref(py));
        }
        if let Some(t) = out.key_text {
            return Ok(out.key_cell.get_or_init(|| PyString::new(py, t).into_any().unbind()).clone_ref(py));
        }
        match &self.key_field {
            Some(f) => Ok(caps[0].ev.obj(py)?.bind(py).call_method1("get", (f.bind(py),))?.unbind()),
            None => Ok(py.None()),
        }
    }

    pub(crate) fn events<'py>(&self, py: Python<'py>, caps: &[Cap]) -> PyResult<Bound<'py, PyTuple>> {
        let cls = &self.classes.matched_event;
        let mut items = Vec::with_capacity(caps.len());
        for c in caps {
            items.push(cls.make(py, &[
                self.var_names[c.var as usize].bind(py).clone().into_any(),
                c.ev.ts.into_pyobject(py)?.into_any(),
                c.ev.seq_obj(py)?.bind(py).clone(),
                c.ev.obj(py)?.bind(py).clone(),
            ])?);
        }
        PyTuple::new(py, items)
    }

    fn measures<'py>(&self, py: Python<'py>, caps: &CapVec) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let last = &caps[caps.len() - 1].ev;
        let cx = self.cx(py, &[]);
        for (name, (_, e)) in self.measure_names.iter().zip(&self.p.measures) {
            let v: Value = e.eval(&cx, last, caps)?;
            d.set_item(name.bind(py), v.to_py(py)?)?;
        }
        Ok(d)
    }

    pub(crate) fn emit_match(&mut self, py: Python<'_>, caps: &CapVec, out: &Out) -> PyResult<()> {
        let events = self.events(py, caps)?;
        self.emit_match_with(py, caps, events, out)
    }

    /// `emit_match` with the match's events built already (the rules of a family that match the
    /// same captures share them, `family.rs`).
    pub(crate) fn emit_match_with(&mut self, py: Python<'_>, caps: &CapVec, events: Bound<'_, PyTuple>, out: &Out) -> PyResult<()> {
        self.stats.matches += 1;
        let m = self.classes.match_.make(py, &[
            self.rule_id_py.bind(py).clone(),
            self.version_py.bind(py).clone(),
            self.emit_py.bind(py).clone(),
            self.key(py, caps, out)?.into_bound(py),
            events.into_any(),
            caps[0].ev.ts.into_pyobject(py)?.into_any(),
            caps[caps.len() - 1].ev.ts.into_pyobject(py)?.into_any(),
            self.measures(py, caps)?.into_any(),
        ])?;
        out.list.append(m)
    }

    fn emit_timeout(&mut self, py: Python<'_>, caps: &CapVec, out: &Out) -> PyResult<()> {
        self.stats.timeouts += 1;
        let deadline = self.deadline(caps).unwrap_or(caps[caps.len() - 1].ev.ts);
        let t = self.classes.timeout.make(py, &[
            self.rule_id_py.bind(py).clone(),
            self.version_py.bind(py).clone(),
            self.timeout_py.bind(py).clone(),
            self.key(py, caps, out)?.into_bound(py),
            self.events(py, caps)?.into_any(),
            caps[0].ev.ts.into_pyobject(py)?.into_any(),
            caps[caps.len() - 1].ev.ts.into_pyobject(py)?.into_any(),
            deadline.into_pyobject(py)?.into_any(),
            self.measures(py, caps)?.into_any(),
        ])?;
        out.list.append(t)
    }
}

#[cfg(test)]
mod tests {
    use super::{fit, Entry, Pool, POOL, POOL_CAPS};
    use crate::expr::{Cap, CapVec, Caps, Cols, Ev, Row};
    use crate::value::Value;
    use std::sync::Arc;

    fn ev(ts: i64) -> Ev {
        let cols = Arc::new(Cols { names: vec!["x".into()], py_names: Vec::new() });
        Ev::from_row(Row { cols, vals: vec![Value::Int(ts)] }, None, ts, ts, Arc::from([0u32]))
    }

    /// Captures of `n` events in a vector with room for `room`.
    fn caps_of_len(n: i64, room: usize) -> Caps {
        let mut v = Vec::with_capacity(room);
        v.extend((0..n).map(|r| Cap { var: 0, row: r, ev: ev(r) }));
        Caps::new(CapVec::from(v))
    }

    /// A capture vector of up to `POOL_CAPS` held by no one else is kept and given to the next
    /// run, emptied, with its room (a trading run's ~30 captures grow in it without a copy);
    /// a larger one, or one another entry holds, is not kept.
    #[test]
    fn the_pool_reuses_capture_vectors_up_to_its_limit() {
        let mut pool = Pool::default();
        let big = caps_of_len(30, POOL_CAPS);
        let block = big.v.as_ptr();
        pool.put_caps(big);
        let c = pool.caps_of(Cap { var: 1, row: 99, ev: ev(99) }, |_| {});
        assert_eq!((c.v.as_ptr(), c.v.capacity(), c.len(), c[0].row), (block, POOL_CAPS, 1, 99));
        pool.put_caps(caps_of_len(1, POOL_CAPS + 1));
        let shared = caps_of_len(1, 4);
        pool.put_caps(shared.clone());
        assert!(pool.caps.is_empty(), "too large, or shared: not kept");
    }

    /// `put_tail` removes the entries from `from` on and keeps their captures held by no
    /// other entry; the entries before `from` stay, in order.
    #[test]
    fn put_tail_keeps_the_unshared_captures_of_the_removed_entries() {
        let mut pool = Pool::default();
        let shared = caps_of_len(2, 4);
        let mut entries: Vec<Entry> = vec![
            Entry { pos: 0, caps: shared.clone() },
            Entry { pos: 1, caps: caps_of_len(1, 4) },
            Entry { pos: 2, caps: shared },
            Entry { pos: 3, caps: caps_of_len(3, 8) },
        ];
        pool.put_tail(&mut entries, 1);
        assert_eq!(entries.iter().map(|e| e.pos).collect::<Vec<_>>(), vec![0]);
        let mut kept: Vec<usize> = pool.caps.iter().map(|c| c.len()).collect();
        kept.sort();
        assert_eq!(kept, vec![1, 3], "the shared captures stay with entry 0");
        pool.put_tail(&mut entries, 1);
        assert_eq!(entries.len(), 1, "nothing from 1 on: nothing removed");
        // A full pool: the entries are just dropped.
        for _ in pool.caps.len()..POOL {
            pool.put_caps(caps_of_len(1, 4));
        }
        entries.push(Entry { pos: 5, caps: caps_of_len(1, 4) });
        pool.put_tail(&mut entries, 0);
        assert!(entries.is_empty());
        assert_eq!(pool.caps.len(), POOL);
    }

    #[test]
    fn fit_moves_a_vector_into_a_block_of_its_length() {
        for (len, cap) in [(0, 0), (0, 4), (1, 2), (2, 4), (3, 3), (5, 8)] {
            let mut v: Vec<u64> = Vec::with_capacity(cap);
            v.extend((0..len).map(|i| i * 7 + 1));
            fit(&mut v);
            assert_eq!(v.capacity(), len as usize, "no spare room left ({len} of {cap})");
            assert_eq!(v, (0..len).map(|i| i * 7 + 1).collect::<Vec<_>>(), "the elements stay, in order");
        }
        // A vector shrunk by one keeps its elements in a new block (mimalloc's realloc would
        // have answered the shrink in place).
        let mut v: Vec<[u8; 48]> = Vec::with_capacity(2);
        v.push([3; 48]);
        let before = v.as_ptr();
        fit(&mut v);
        assert_eq!((v.len(), v.capacity(), v[0]), (1, 1, [3; 48]));
        assert_ne!(v.as_ptr(), before, "a new block");
        // Zero-sized elements: no block, the length kept.
        let mut z = vec![(); 3];
        fit(&mut z);
        assert_eq!(z.len(), 3);
    }
}
