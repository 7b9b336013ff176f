//! Rule families (docs/rule-families.md): the rules of a group whose programs differ only in
//! constants, WITHIN / STEP WITHIN and what they emit share one set of NFA runs per key. Every
//! entry carries a mask of the members for which it is alive; member `i`'s own state is the
//! projection on bit `i`, and every step below keeps "projection of the family step = the
//! per-rule step (`matcher.rs`) of the projection".

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::engine::RuleE;
use crate::expr::{Cap, CapVec, Caps, Ev, RowMemo, NO_CAPS};
pub use crate::family_build::{build, shape, Thresh};
use crate::matcher::{push_next, Core, Entry, Loc, MState, Out, Pool, Run, FOREVER};
use crate::program::{Conn, DONE};

/// How a variable's condition differs between the members.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Vary {
    /// The same in every member: evaluated once, with the first member's program.
    Same,
    /// Reads only the event and differs: each member's evaluated once per event (a mask).
    Local,
    /// Reads captures and differs: evaluated per member of an entry's mask.
    Other,
}

pub struct Family {
    /// The members' rule indexes in the engine (bit `i` is `members[i]`), ordered by their time
    /// limits (each rule's results are put back in rule order by `FOut`).
    pub members: Vec<usize>,
    pub vary: Vec<Vary>,
    /// Per variable, its `Thresh` form when it has one.
    pub thresh: Vec<Option<Thresh>>,
    /// Every member's deadline is at most the next member's (WITHIN and STEP WITHIN both
    /// non-decreasing with the bit): the earliest of a mask is its lowest bit's, and the
    /// members that expired are a prefix.
    pub mono: bool,
    pub within: Vec<Option<i64>>,
    pub step: Vec<Option<i64>>,
    /// Some member has a time limit (then all have: presence is part of the shape).
    pub timed: bool,
    /// The members have STEP WITHIN (all or none: presence is part of the shape). Without it
    /// every entry of a run has the run's deadlines (WITHIN from the run's first event).
    pub stepped: bool,
    /// The smallest partial-match cap of the members.
    pub min_cap: usize,
    /// Vectors kept from key to key (a family runs on one key at a time; the lock is taken once
    /// per key and call, `run_key`).
    pub scratch: Mutex<Scratch>,
}

#[derive(Clone)]
pub struct FEntry {
    pub pos: i32,
    pub mask: u64,
    pub caps: Caps,
}

#[derive(Clone)]
pub struct FRun {
    pub start: i64,
    /// The time of the run's first event (every entry's first capture): its deadlines without
    /// STEP WITHIN, read without going through an entry's captures.
    pub ts: i64,
    pub entries: Vec<FEntry>,
}

#[derive(Clone, Default)]
pub struct FState {
    pub row: i64,
    pub runs: Vec<FRun>,
    pub deadline: Option<i64>,
}

/// The families' results for one key (one list for all the families of the key's group), each
/// tagged with its member's rule index, in the order each member emitted them (`Engine` appends
/// a rule's results at that rule's turn).
pub struct FOut<'py> {
    pub out: Out<'py>,
    pub tags: Vec<usize>,
}

impl<'py> FOut<'py> {
    pub fn new(py: Python<'py>, key: &'py str) -> Self {
        FOut { out: Out::lazy(PyList::empty(py), key), tags: Vec::new() }
    }

    /// Rule `ri`'s results, appended to `to` in order. The engine asks once per rule of the
    /// group (96 times a key in bench.native_rules): the tags are scanned, and only rule `ri`'s
    /// results are read from the list (iterating the list per rule touched and counted every
    /// result: ~3% of the 96-rule run, session 20).
    pub fn append_rule(&self, ri: usize, to: &Bound<'py, PyList>) -> PyResult<()> {
        for (k, &tag) in self.tags.iter().enumerate() {
            if tag == ri {
                to.append(self.out.list.get_item(k)?)?;
            }
        }
        Ok(())
    }
}

/// The bits of `m`, lowest first.
fn bits(mut m: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            i
        })
    })
}

/// The per-event caches: the first member's local conditions (and the group's shared ones) and
/// the masks of the varying local conditions.
struct Tests<'a> {
    loc: Loc<'a>,
    masks: [u64; 8],
    known: u8,
}

/// What one entry becomes: kept as it is (a complete match waiting), complete (an absence), its
/// grown entries for the members that took the event, its stay/skip entry.
#[derive(Clone, Copy, Default)]
struct FAct {
    keep: u64,
    done: u64,
    grow: u64,
    after: u64,
}

/// Vectors kept from event to event and key to key: `step` builds into `spare` and swaps;
/// ended runs give back their entry vectors (`entries`) and their captures held by no one else
/// (`pool`), which `spawn` reuses (as `Core::spawn` does with its `Pool`).
#[derive(Default)]
pub struct Scratch {
    acts: Vec<FAct>,
    spare: Vec<FEntry>,
    entries: Vec<Vec<FEntry>>,
    pool: Pool,
}

/// At most this many entry vectors kept (`Scratch::entries`), of at most 8 entries.
const KEPT: usize = 32;

impl Scratch {
    /// An entry that ends: its captures back to the pool when no one else holds them.
    fn put(&mut self, e: FEntry) {
        self.pool.put_caps(e.caps);
    }

    /// The entries of `v` without members removed (their captures to the pool), order kept.
    fn drop_empty(&mut self, v: &mut Vec<FEntry>) {
        keep_in_order(v, |e| e.mask != 0, |e| self.put(e));
    }

    /// An ended run's (emptied) entry vector.
    fn put_run(&mut self, r: FRun) {
        let mut v = r.entries;
        for e in v.drain(..) {
            self.put(e);
        }
        if self.entries.len() < KEPT && (1..=8).contains(&v.capacity()) {
            self.entries.push(v);
        }
    }
}

impl FAct {
    fn any(&self) -> bool {
        self.keep | self.done | self.grow | self.after != 0
    }
}

fn count(runs: &[FRun], b: u64) -> usize {
    runs.iter().map(|r| r.entries.iter().filter(|e| e.mask & b != 0).count()).sum()
}

fn clear(run: &mut FRun, b: u64) {
    for e in run.entries.iter_mut() {
        e.mask &= !b;
    }
}

/// Entries with an empty mask and runs without entries removed (to the scratch's pools), order
/// kept.
fn tidy(runs: &mut Vec<FRun>, sc: &mut Scratch) {
    for r in runs.iter_mut().filter(|r| r.entries.iter().any(|e| e.mask == 0)) {
        sc.drop_empty(&mut r.entries);
    }
    keep_in_order(runs, |r| !r.entries.is_empty(), |r| sc.put_run(r));
}

/// The elements of `v` for which `keep` holds, order kept; the others handed to `put`.
fn keep_in_order<T>(v: &mut Vec<T>, keep: impl Fn(&T) -> bool, mut put: impl FnMut(T)) {
    let mut w = 0;
    for k in 0..v.len() {
        if keep(&v[k]) {
            v.swap(w, k);
            w += 1;
        }
    }
    for x in v.drain(w..) {
        put(x);
    }
}

/// `caps` with every row moved by `shift`.
fn shifted(caps: &Caps, shift: i64) -> Caps {
    if shift == 0 {
        return caps.clone();
    }
    let v = caps.iter().map(|c| Cap { var: c.var, row: c.row + shift, ev: c.ev.clone() }).collect();
    Caps::new(CapVec { v, acc: caps.acc.clone() })
}

fn same_caps(a: &[Cap], b: &[Cap]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.row == y.row && x.var == y.var)
}

impl Family {
    fn rep<'r>(&self, rules: &'r [RuleE]) -> &'r Core {
        &rules[self.members[0]].core
    }

    fn full(&self) -> u64 {
        if self.members.len() == 64 {
            u64::MAX
        } else {
            (1u64 << self.members.len()) - 1
        }
    }

    /// Member `i`'s deadline for a partial match whose first and last events are at `ts`
    /// (`Core::deadline`).
    fn deadline_of(&self, i: usize, (first, last): (i64, i64)) -> Option<i64> {
        let mut d = self.within[i].map(|w| first.saturating_add(w));
        if let Some(s) = self.step[i] {
            let s = last.saturating_add(s);
            d = Some(d.map_or(s, |x| x.min(s)));
        }
        d
    }

    /// The (first, last) event times an entry of run `r` with captures `caps` has its
    /// deadlines from: without STEP WITHIN only the run's first event counts (no captures read).
    fn times(&self, r: &FRun, caps: &[Cap]) -> (i64, i64) {
        match self.stepped {
            true => (r.ts, caps[caps.len() - 1].ev.ts),
            false => (r.ts, r.ts),
        }
    }

    fn min_deadline(&self, mask: u64, ts: (i64, i64)) -> Option<i64> {
        if !self.timed || mask == 0 {
            return None;
        }
        if self.mono {
            return self.deadline_of(mask.trailing_zeros() as usize, ts);
        }
        bits(mask).filter_map(|i| self.deadline_of(i, ts)).min()
    }

    /// The earliest deadline of the runs' partial matches (the state's `deadline`). Without
    /// STEP WITHIN a run's entries share their deadlines: one per run, over the union of masks.
    fn earliest(&self, runs: &[FRun]) -> Option<i64> {
        if !self.stepped {
            let mask = |r: &FRun| r.entries.iter().filter(|e| e.pos != DONE).fold(0, |m, e| m | e.mask);
            return runs.iter().filter_map(|r| self.min_deadline(mask(r), (r.ts, r.ts))).min();
        }
        let live = runs.iter().flat_map(|r| r.entries.iter().filter(|e| e.pos != DONE).map(move |e| (r, e)));
        live.filter_map(|(r, e)| self.min_deadline(e.mask, self.times(r, &e.caps))).min()
    }

    /// The members of `mask` whose deadline has passed at `now` (all at `FOREVER`).
    fn expired(&self, mask: u64, ts: (i64, i64), now: i64) -> u64 {
        if !self.timed {
            return if now == FOREVER { mask } else { 0 };
        }
        if self.mono {
            let passed = |i: usize| self.deadline_of(i, ts).is_some_and(|d| d <= now);
            let (mut lo, mut hi) = (0, self.members.len());
            while lo < hi {
                let mid = (lo + hi) / 2;
                if passed(mid) {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            let prefix = if lo == 64 { u64::MAX } else { (1u64 << lo) - 1 };
            return mask & prefix;
        }
        bits(mask).filter(|&i| self.deadline_of(i, ts).is_some_and(|d| d <= now)).fold(0, |m, i| m | 1 << i)
    }

    // ------------------------------------------------------------------ tests

    /// The members of `m` for which variable `var`'s condition holds.
    #[allow(clippy::too_many_arguments)]
    fn tmask(&self, rules: &[RuleE], py: Python<'_>, var: usize, ev: &Ev, caps: &CapVec, m: u64, t: &mut Tests<'_>) -> PyResult<u64> {
        if m == 0 {
            return Ok(0);
        }
        match self.vary[var] {
            Vary::Same => Ok(if self.rep(rules).test(py, var, ev, caps, &mut t.loc)? { m } else { 0 }),
            Vary::Local => {
                if t.known & (1 << var) == 0 {
                    let mut r = 0u64;
                    if let Some(th) = &self.thresh[var] {
                        let rep = self.rep(rules);
                        let a = rep.cx(py, &[]).field(ev, th.field)?;
                        if !a.is_null() {
                            r = th.mask(py, &rep.ops, &a)?;
                        }
                    } else {
                        for (i, &ri) in self.members.iter().enumerate() {
                            // Each member's own test (a fresh memo: members differ here), the
                            // engine's shared conditions still consulted.
                            let mut loc = Loc { own: &mut [None; 8], shared: &mut *t.loc.shared, rows: &[] };
                            if rules[ri].core.test(py, var, ev, &NO_CAPS, &mut loc)? {
                                r |= 1 << i;
                            }
                        }
                    }
                    t.masks[var] = r;
                    t.known |= 1 << var;
                }
                Ok(t.masks[var] & m)
            }
            Vary::Other => {
                let mut r = 0u64;
                for i in bits(m) {
                    let c = &rules[self.members[i]].core;
                    let holds = match &c.p.conds[var] {
                        None => true,
                        Some(cond) => cond.eval(&c.cx(py, &[]), ev, caps)?.is_true(),
                    };
                    if holds {
                        r |= 1 << i;
                    }
                }
                Ok(r)
            }
        }
    }

    /// The members of `m` for which one of `vars` holds (`Core::any`).
    #[allow(clippy::too_many_arguments)]
    fn any(&self, rules: &[RuleE], py: Python<'_>, vars: &[usize], ev: &Ev, caps: &CapVec, m: u64, t: &mut Tests<'_>) -> PyResult<u64> {
        let mut r = 0u64;
        for &g in vars {
            r |= self.tmask(rules, py, g, ev, caps, m & !r, t)?;
            if r == m {
                break;
            }
        }
        Ok(r)
    }

    // ------------------------------------------------------------------ stepping

    /// The entries an event starts (an entry vector and captures from the scratch's pools).
    #[allow(clippy::too_many_arguments)]
    fn spawn(&self, rules: &[RuleE], py: Python<'_>, ev: &Ev, row: i64, t: &mut Tests<'_>, sc: &mut Scratch) -> PyResult<Vec<FEntry>> {
        let rep = self.rep(rules);
        let mut out = Vec::new();
        for (var, nxt) in &rep.p.starts {
            let m = self.tmask(rules, py, *var, ev, &NO_CAPS, self.full(), t)?;
            if m != 0 {
                if out.capacity() == 0 {
                    out = sc.entries.pop().unwrap_or_default();
                }
                let cap = Cap { var: *var as u32, row, ev: ev.clone() };
                let caps = sc.pool.caps_of(cap, |c| c.fold_last(&rep.cx(py, t.loc.rows)));
                push_next(&mut out, nxt, caps, |pos, caps| FEntry { pos, mask: m, caps });
            }
        }
        Ok(out)
    }

    /// `Core::decide_step` on masks.
    fn decide(&self, rules: &[RuleE], py: Python<'_>, e: &FEntry, ev: &Ev, t: &mut Tests<'_>) -> PyResult<FAct> {
        let mut a = FAct::default();
        if e.pos == DONE {
            a.keep = e.mask;
            return Ok(a);
        }
        let st = &self.rep(rules).p.table[e.pos as usize];
        let mut m = e.mask;
        if !st.not_next.is_empty() {
            m &= !self.any(rules, py, &st.not_next, ev, &e.caps, m, t)?;
        }
        if m == 0 {
            return Ok(a);
        }
        if st.absence {
            if st.not_followed.is_empty() {
                a.done = m;
            } else {
                a.after = m & !self.any(rules, py, &st.not_followed, ev, &e.caps, m, t)?;
            }
            return Ok(a);
        }
        let taken = self.tmask(rules, py, st.var, ev, &e.caps, m, t)?;
        a.grow = taken;
        let rest = match st.conn {
            Conn::Strict => 0,
            Conn::Relaxed => m & !taken,
            Conn::Any => m,
        };
        a.after = if rest != 0 && !st.not_followed.is_empty() {
            rest & !self.any(rules, py, &st.not_followed, ev, &e.caps, rest, t)?
        } else {
            rest
        };
        Ok(a)
    }

    /// `Core::step` on masks: every test first, then the entries built (captures shared only
    /// with an ending entry grow in place).
    #[allow(clippy::too_many_arguments)]
    fn step(&self, rules: &[RuleE], py: Python<'_>, entries: &mut Vec<FEntry>, sc: &mut Scratch, ev: &Ev, row: i64, t: &mut Tests<'_>) -> PyResult<()> {
        let mut acts = std::mem::take(&mut sc.acts);
        acts.clear();
        for e in entries.iter() {
            acts.push(self.decide(rules, py, e, ev, t)?);
        }
        // The entries that end are dropped first (their captures to the pool), order kept, so
        // that captures shared only with an ending entry grow in place below.
        let mut w = 0;
        for i in 0..entries.len() {
            if acts[i].any() {
                entries.swap(w, i);
                acts[w] = acts[i];
                w += 1;
            }
        }
        for e in entries.drain(w..) {
            sc.put(e);
        }
        acts.truncate(w);
        let rep = self.rep(rules);
        let mut out = std::mem::take(&mut sc.spare);
        out.clear();
        for (FEntry { pos, caps, .. }, a) in entries.drain(..).zip(acts.iter()) {
            if a.keep != 0 {
                out.push(FEntry { pos, mask: a.keep, caps });
                continue;
            }
            if a.done != 0 {
                out.push(FEntry { pos: DONE, mask: a.done, caps });
                continue;
            }
            let st = &rep.p.table[pos as usize];
            if a.grow == 0 {
                out.push(FEntry { pos: st.after, mask: a.after, caps });
                continue;
            }
            let cap = Cap { var: st.var as u32, row, ev: ev.clone() };
            if a.after != 0 {
                let grown = Caps::new(rep.grown(py, &caps, cap, &t.loc));
                push_next(&mut out, &st.next, grown, |pos, caps| FEntry { pos, mask: a.grow, caps });
                out.push(FEntry { pos: st.after, mask: a.after, caps });
                continue;
            }
            // The entry itself does not go on: its captures grow in place when no other entry
            // shares them (copy on write), else are copied.
            let mut c = caps;
            let grown: Caps = match Caps::get_mut(&mut c) {
                Some(v) => {
                    v.v.push(cap);
                    v.fold_last(&rep.cx(py, t.loc.rows));
                    c
                }
                None => Caps::new(rep.grown(py, &c, cap, &t.loc)),
            };
            push_next(&mut out, &st.next, grown, |pos, caps| FEntry { pos, mask: a.grow, caps });
        }
        sc.spare = std::mem::replace(entries, out);
        sc.acts = acts;
        Ok(())
    }

    /// `Core::feed` for the family: one event of this key.
    #[allow(clippy::too_many_arguments)]
    fn feed(&self, rules: &mut [RuleE], py: Python<'_>, state: Option<FState>, ev: &Ev, shared: &mut [u8], sc: &mut Scratch, out: &mut FOut<'_>) -> PyResult<Option<FState>> {
        let ts = ev.ts;
        let mut state = state;
        if state.as_ref().is_some_and(|s| s.deadline.is_some_and(|d| d < ts)) {
            let mut s = state.take().unwrap_or_default();
            // `advance(ts - 1)`. Its settling can only emit when an entry is complete; without
            // one, all it would do (drop what has no member left, the deadline) the settling
            // after this event does, as masks only lost bits (nothing new to prune, no cap
            // passed). A state left without members is ended, as settling ends it.
            if self.expire(rules, &mut s.runs, ts - 1, sc) {
                state = self.settle(rules, py, s.row, s.runs, sc, out, None)?;
            } else if s.runs.iter().any(|r| !r.entries.is_empty()) {
                state = Some(s);
            } else {
                for r in s.runs {
                    sc.put_run(r);
                }
            }
        }
        let (row, runs) = {
            let rules: &[RuleE] = rules;
            let rep = self.rep(rules);
            let mut own = [None; 8];
            // The memo of condition aggregates (`Core::feed`): none made for a family without.
            let memo: [RowMemo; 8];
            let rows: &[RowMemo] = match rep.p.nmemo {
                0 => &[],
                n => {
                    memo = Default::default();
                    &memo[..n]
                }
            };
            let mut t = Tests {
                loc: Loc { own: &mut own[..rep.p.vars.len()], shared, rows },
                masks: [0; 8],
                known: 0,
            };
            match state {
                None => {
                    let spawned = self.spawn(rules, py, ev, 0, &mut t, sc)?;
                    if spawned.is_empty() {
                        return Ok(None);
                    }
                    (0, vec![FRun { start: 0, ts, entries: spawned }])
                }
                Some(mut s) => {
                    for r in s.runs.iter_mut() {
                        self.step(rules, py, &mut r.entries, sc, ev, s.row, &mut t)?;
                    }
                    let spawned = self.spawn(rules, py, ev, s.row, &mut t, sc)?;
                    if !spawned.is_empty() {
                        s.runs.push(FRun { start: s.row, ts, entries: spawned });
                    }
                    (s.row, s.runs)
                }
            }
        };
        self.settle(rules, py, row + 1, runs, sc, out, Some(ts))
    }

    // ------------------------------------------------------------------ time

    /// `Core::advance`: entries whose member deadline passed lose those members (an absence
    /// completes for them).
    #[allow(clippy::too_many_arguments)]
    fn advance(&self, rules: &mut [RuleE], py: Python<'_>, state: FState, now: i64, sc: &mut Scratch, out: &mut FOut<'_>) -> PyResult<Option<FState>> {
        let mut state = state;
        self.expire(rules, &mut state.runs, now, sc);
        self.settle(rules, py, state.row, state.runs, sc, out, None)
    }

    /// `advance` before settling: the entries whose member deadline passed at `now` lose those
    /// members (an absence completes for them); entries without members are dropped (their
    /// captures to the pool). True when an entry is complete.
    fn expire(&self, rules: &[RuleE], runs: &mut [FRun], now: i64, sc: &mut Scratch) -> bool {
        let mut done = false;
        for r in runs.iter_mut() {
            // Without STEP WITHIN the members expired are the same for every entry of the run
            // (`times`): a run where none expired is left as it is without visiting its entries.
            let whole = match self.stepped {
                true => None,
                false => match self.expired(self.full(), (r.ts, r.ts), now) {
                    0 => continue,
                    x => Some(x),
                },
            };
            let mut i = 0;
            while i < r.entries.len() {
                let e = &r.entries[i];
                if e.pos == DONE {
                    i += 1;
                    continue;
                }
                let x = match whole {
                    Some(x) => e.mask & x,
                    None => self.expired(e.mask, self.times(r, &e.caps), now),
                };
                if x != 0 && self.rep(rules).p.table[e.pos as usize].absence {
                    let rest = FEntry { pos: e.pos, mask: e.mask & !x, caps: e.caps.clone() };
                    r.entries[i].pos = DONE;
                    r.entries[i].mask = x;
                    if rest.mask != 0 {
                        r.entries.insert(i + 1, rest);
                        i += 1;
                    }
                } else {
                    r.entries[i].mask &= !x;
                }
                i += 1;
            }
            sc.drop_empty(&mut r.entries);
        }
        for r in runs.iter() {
            done |= r.entries.iter().any(|e| e.pos == DONE);
        }
        done
    }

    /// `Core::on_end`: what needs no more time is emitted, the rest dropped.
    fn on_end(&self, rules: &mut [RuleE], py: Python<'_>, state: FState, sc: &mut Scratch, out: &mut FOut<'_>) -> PyResult<()> {
        let mut runs = state.runs;
        for r in runs.iter_mut() {
            let table = &self.rep(rules).p.table;
            r.entries.retain(|e| e.pos == DONE || (!self.timed && table[e.pos as usize].absence));
            for e in r.entries.iter_mut() {
                e.pos = DONE;
            }
        }
        self.settle(rules, py, state.row, runs, sc, out, None)?;
        Ok(())
    }

    // ------------------------------------------------------------------ deciding

    #[allow(clippy::too_many_arguments)]
    fn settle(&self, rules: &mut [RuleE], py: Python<'_>, row: i64, runs: Vec<FRun>, sc: &mut Scratch, out: &mut FOut<'_>, ts: Option<i64>) -> PyResult<Option<FState>> {
        let mut runs = runs;
        for r in runs.iter_mut() {
            self.prune(rules, r);
        }
        self.decide_runs(rules, py, &mut runs, sc, out)?;
        let total: usize = runs.iter().map(|r| r.entries.len()).sum();
        if total > self.min_cap && self.cap(rules, py, &mut runs, out, ts)? {
            self.decide_runs(rules, py, &mut runs, sc, out)?;
        }
        tidy(&mut runs, sc);
        if runs.is_empty() {
            return Ok(None);
        }
        let deadline = self.earliest(&runs);
        Ok(Some(FState { row, runs, deadline }))
    }

    /// `Core::prune` per member: an entry loses the members for which an earlier entry with the
    /// same key was kept, and every member's entries after its complete match.
    fn prune(&self, rules: &[RuleE], run: &mut FRun) {
        let n = run.entries.len();
        if n < 2 {
            return;
        }
        let rep = self.rep(rules);
        let all = rep.all_matches;
        let mut done = 0u64;
        for i in 0..n {
            let (before, rest) = run.entries.split_at_mut(i);
            let e = &mut rest[0];
            let mut m = e.mask & !done;
            let is_done = e.pos == DONE;
            if m != 0 && (all || !is_done) {
                for k in before.iter() {
                    if k.mask & m != 0 && rep.same_key(k.pos, &k.caps, e.pos, &e.caps) {
                        m &= !k.mask;
                    }
                }
            }
            e.mask = m;
            if is_done && !all {
                done |= m;
            }
        }
        run.entries.retain(|e| e.mask != 0);
    }

    /// Member `i`'s match. Members matching the same captures (one shared entry) share the
    /// match's events tuple (`shared`: the last captures and their tuple; the members' variable
    /// names are the same).
    #[allow(clippy::too_many_arguments)]
    fn emit<'py>(&self, rules: &mut [RuleE], py: Python<'py>, i: usize, caps: &Caps, shared: &mut Option<(Caps, Bound<'py, PyTuple>)>, out: &mut FOut<'_>) -> PyResult<()> {
        let ri = self.members[i];
        let events = match shared {
            Some((c, t)) if Caps::ptr_eq(c, caps) => t.clone(),
            _ => {
                let t = rules[ri].core.events(py, caps)?;
                *shared = Some((caps.clone(), t.clone()));
                t
            }
        };
        rules[ri].core.emit_match_with(py, caps, events, &out.out)?;
        out.tags.push(ri);
        Ok(())
    }

    /// `Core::decide` / `decide_all` per member, for the members with a complete entry.
    fn decide_runs(&self, rules: &mut [RuleE], py: Python<'_>, runs: &mut Vec<FRun>, sc: &mut Scratch, out: &mut FOut<'_>) -> PyResult<()> {
        let mut dmask = 0u64;
        for r in runs.iter() {
            for e in &r.entries {
                if e.pos == DONE {
                    dmask |= e.mask;
                }
            }
        }
        if dmask == 0 {
            return Ok(());
        }
        let all = self.rep(rules).all_matches;
        let mut shared = None;
        for i in bits(dmask) {
            let b = 1u64 << i;
            if all {
                for r in runs.iter_mut() {
                    for k in 0..r.entries.len() {
                        if r.entries[k].pos == DONE && r.entries[k].mask & b != 0 {
                            let caps = r.entries[k].caps.clone();
                            self.emit(rules, py, i, &caps, &mut shared, out)?;
                            r.entries[k].mask &= !b;
                        }
                    }
                }
                continue;
            }
            let mut floor = -1i64;
            let mut head = true;
            for r in runs.iter_mut() {
                let Some(first) = r.entries.iter().find(|e| e.mask & b != 0) else { continue };
                if r.start < floor {
                    clear(r, b);
                    continue;
                }
                if head {
                    if first.pos == DONE {
                        let caps = first.caps.clone();
                        self.emit(rules, py, i, &caps, &mut shared, out)?;
                        floor = rules[self.members[i]].core.resume(&caps);
                        clear(r, b);
                        continue;
                    }
                    head = false;
                }
            }
        }
        tidy(runs, sc);
        Ok(())
    }

    /// `Core::drop_oldest` per member over its cap; true when something was dropped.
    fn cap(&self, rules: &mut [RuleE], py: Python<'_>, runs: &mut [FRun], out: &mut FOut<'_>, ts: Option<i64>) -> PyResult<bool> {
        let mut any = false;
        for (i, &ri) in self.members.iter().enumerate() {
            let b = 1u64 << i;
            let cap = rules[ri].core.cap;
            let mut total = count(runs, b);
            if total <= cap {
                continue;
            }
            any = true;
            let mut dropped = 0usize;
            let mut nruns = runs.iter().filter(|r| r.entries.iter().any(|e| e.mask & b != 0)).count();
            for r in runs.iter_mut() {
                if total <= cap || nruns <= 1 {
                    break;
                }
                let n = r.entries.iter().filter(|e| e.mask & b != 0).count();
                if n > 0 {
                    clear(r, b);
                    total -= n;
                    dropped += n;
                    nruns -= 1;
                }
            }
            if total > cap {
                if let Some(r) = runs.iter_mut().find(|r| r.entries.iter().any(|e| e.mask & b != 0)) {
                    let mut seen = 0;
                    for e in r.entries.iter_mut().filter(|e| e.mask & b != 0) {
                        seen += 1;
                        if seen > cap {
                            e.mask &= !b;
                        }
                    }
                }
                dropped += total - cap;
            }
            let core = &mut rules[ri].core;
            let first = runs.iter().flat_map(|r| r.entries.iter()).find(|e| e.mask & b != 0);
            let key = match first {
                Some(e) => core.key(py, &e.caps, &out.out)?,
                None => py.None(),
            };
            core.emit_dropped(py, key, dropped, ts, &out.out)?;
            out.tags.push(ri);
        }
        Ok(any)
    }

    // ------------------------------------------------------------------ the engine's view

    /// One key's new events, then time up to `safe`, then the end of input (`advance_key`).
    #[allow(clippy::too_many_arguments)]
    pub fn run_key(
        &self,
        rules: &mut [RuleE],
        py: Python<'_>,
        state: Option<FState>,
        evs: &[Ev],
        shared: &mut [u8],
        ncids: usize,
        safe: i64,
        eof: bool,
        out: &mut FOut<'_>,
    ) -> PyResult<Option<FState>> {
        let mut s = state;
        // A panic while the lock was held leaves only vectors to reuse (emptied when reused).
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let sc = &mut *guard;
        for (k, ev) in evs.iter().enumerate() {
            s = self.feed(rules, py, s, ev, &mut shared[k * ncids..(k + 1) * ncids], sc, out)?;
        }
        if s.as_ref().and_then(|m| m.deadline).is_some_and(|d| d <= safe) {
            if let Some(m) = s.take() {
                s = self.advance(rules, py, m, safe, sc, out)?;
            }
        }
        if eof {
            if let Some(m) = s.take() {
                self.on_end(rules, py, m, sc, out)?;
            }
        }
        for &ri in &self.members {
            rules[ri].core.stats.events += evs.len() as u64;
        }
        Ok(s)
    }

    /// Member `i`'s own state (its part of a key state): the projection on bit `i`.
    pub fn project(&self, s: &FState, i: usize) -> Option<MState> {
        let b = 1u64 << i;
        let mut deadline: Option<i64> = None;
        let mut runs = Vec::new();
        for r in &s.runs {
            let mut entries = Vec::new();
            for e in r.entries.iter().filter(|e| e.mask & b != 0) {
                if e.pos != DONE {
                    if let Some(d) = self.deadline_of(i, self.times(r, &e.caps)).filter(|_| self.timed) {
                        deadline = Some(deadline.map_or(d, |x: i64| x.min(d)));
                    }
                }
                entries.push(Entry { pos: e.pos, caps: e.caps.clone() });
            }
            if !entries.is_empty() {
                runs.push(Run { start: r.start, entries, tpart: None, matched: false });
            }
        }
        (!runs.is_empty()).then_some(MState { row: s.row, runs, deadline })
    }

    /// The live entries of member `i` (`partials_of` of its projection).
    pub fn partials(&self, s: Option<&FState>, i: usize) -> i64 {
        s.map_or(0, |s| count(&s.runs, 1 << i) as i64)
    }

    /// The family state of the members' own states (`(bit, state)`, e.g. read from bytes):
    /// rows shifted so that every member's next row is the family's, runs with one start
    /// merged, equal entries merged into one (each member's order kept).
    pub fn regroup(&self, parts: Vec<(usize, MState)>) -> Option<FState> {
        let row = parts.iter().map(|(_, m)| m.row).max()?;
        let mut all: Vec<(i64, usize, Vec<Entry>)> = Vec::new();
        for (bit, m) in parts {
            let shift = row - m.row;
            for r in m.runs {
                let entries = r.entries.into_iter().map(|e| Entry { pos: e.pos, caps: shifted(&e.caps, shift) }).collect();
                all.push((r.start + shift, bit, entries));
            }
        }
        all.sort_by_key(|(start, bit, _)| (*start, *bit));
        let mut runs: Vec<FRun> = Vec::new();
        for (start, bit, entries) in all {
            if runs.last().is_none_or(|r| r.start != start) {
                runs.push(FRun { start, ts: 0, entries: Vec::new() });
            }
            let Some(run) = runs.last_mut() else { continue };
            let b = 1u64 << bit;
            let mut at = 0;
            for e in entries {
                let found = (at..run.entries.len()).find(|&k| {
                    let f = &run.entries[k];
                    f.mask & b == 0 && f.pos == e.pos && same_caps(&f.caps, &e.caps)
                });
                match found {
                    Some(k) => {
                        run.entries[k].mask |= b;
                        at = k + 1;
                    }
                    None => {
                        run.entries.insert(at, FEntry { pos: e.pos, mask: b, caps: e.caps });
                        at += 1;
                    }
                }
            }
        }
        runs.retain(|r| !r.entries.is_empty());
        for r in runs.iter_mut() {
            r.ts = r.entries[0].caps[0].ev.ts;
        }
        let deadline = self.earliest(&runs);
        (!runs.is_empty()).then_some(FState { row, runs, deadline })
    }
}
