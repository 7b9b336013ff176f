//! A key's partial matches packed at rest (docs/native-core.md, "Many keys: a compact key layout
//! (design, session 17)" and "Many keys: the packed key (session 18)"): the matcher states of a
//! key's parts as fixed-width words and its captured events as one slice of `Ev`s, two
//! blocks where the live form has six per partial match (parts, runs, entries, the captures'
//! `Arc` and their vector). Never serialised: `CEPNK` is written from the unpacked state.

use crate::expr::{Cap, CapVec, Caps, Ev};
use crate::matcher::{Core, Entry, MState, Run};
use crate::program::DONE;

/// Distinct capture vectors or events past which a key stays live (the lookups that share them
/// are linear: a few per fraud card).
const MAX_SHARED: usize = 64;

/// The flag of a part with a deadline, and of a run's matched and `tpart` (in their count words).
const HAS_DEADLINE: u64 = 1 << 63;
const MATCHED: u64 = 1 << 32;
const HAS_TPART: u64 = 1 << 33;

/// Matcher states packed: `words` holds, in order, a header (number of parts | number of
/// capture vectors << 32); per capture vector its length | its uses << 32, then per capture (var | event index
/// << 32, row); per part (fp | runs << 32 | `HAS_DEADLINE`, row, deadline); per run (start,
/// entries | `MATCHED` | `HAS_TPART` | tpart's vector << 34); per entry (pos as u32 | vector
/// << 32). Captures shared between entries (or with a `tpart`) are one vector, an event
/// captured several times one element of `evs`: unpacked, they are shared as they were.
pub struct Packed {
    words: Box<[u64]>,
    evs: Box<[Ev]>,
}

/// Distinct shared handles (capture vectors or events) by address, in the order first seen,
/// with their uses: at most `MAX_SHARED`, on the stack (no allocation per pack; docs/native-core.md,
/// "Many keys: the packed key's steady call (session 20, core20p)"). Borrowed: no reference count
/// written while packing.
struct Seen<'a, T> {
    at: [(Option<&'a T>, u64); MAX_SHARED],
    n: usize,
}

impl<'a, T: Shared> Seen<'a, T> {
    fn new() -> Self {
        Seen { at: [(None, 0); MAX_SHARED], n: 0 }
    }

    fn seen(&self) -> impl Iterator<Item = (&'a T, u64)> + '_ {
        self.at[..self.n].iter().map(|&(x, uses)| (x.expect("pack.rs: a seen handle"), uses))
    }

    /// The index of `x` by pointer, if seen.
    fn find(&self, x: &T) -> Option<u64> {
        self.seen().position(|(s, _)| std::ptr::eq(s.addr(), x.addr())).map(|i| i as u64)
    }

    /// The index of `x` by pointer, added when new (with a count of 1, else counted once more);
    /// None past `MAX_SHARED`.
    fn index_of(&mut self, x: &'a T) -> Option<u64> {
        if let Some(i) = self.find(x) {
            self.at[i as usize].1 += 1;
            return Some(i);
        }
        if self.n == MAX_SHARED {
            return None;
        }
        self.at[self.n] = (Some(x), 1);
        self.n += 1;
        Some(self.n as u64 - 1)
    }
}

/// A handle to a shared block, compared by the block's address.
trait Shared {
    fn addr(&self) -> *const u8;
}

impl Shared for Caps {
    fn addr(&self) -> *const u8 {
        Caps::as_ptr(self).cast()
    }
}

impl Shared for Ev {
    fn addr(&self) -> *const u8 {
        self.as_ptr()
    }
}

/// The words of `parts` after the capture vectors (per part, run and entry: `Packed`'s layout),
/// each given to `put`, a capture vector's index from `cv` (tpart first, then the entries'):
/// the number of parts, or None when `cv` gives none.
fn walk<'a>(
    parts: impl Iterator<Item = (u32, &'a MState)>,
    mut cv: impl FnMut(&'a Caps) -> Option<u64>,
    mut put: impl FnMut(u64),
) -> Option<u64> {
    let mut nparts = 0u64;
    for (fp, m) in parts {
        nparts += 1;
        let deadline = if m.deadline.is_some() { HAS_DEADLINE } else { 0 };
        put(u64::from(fp) | (m.runs.len() as u64) << 32 | deadline);
        put(m.row as u64);
        put(m.deadline.unwrap_or(0) as u64);
        for r in &m.runs {
            let mut flags = r.entries.len() as u64 | if r.matched { MATCHED } else { 0 };
            if let Some(t) = &r.tpart {
                flags |= HAS_TPART | cv(t)? << 34;
            }
            put(r.start as u64);
            put(flags);
            for e in &r.entries {
                put(u64::from(e.pos as u32) | cv(&e.caps)? << 32);
            }
        }
    }
    Some(nparts)
}

impl Packed {
    /// The states `parts` (fingerprint, state) packed, or None when one of them keeps running
    /// aggregates (`CapVec::acc`) or shares more than `MAX_SHARED` vectors or events. The
    /// blocks of `reuse` (the key's packing before this call) are written over when the new
    /// words or events are as many, else freed: a steady key allocates nothing here.
    pub fn pack<'a>(parts: impl Iterator<Item = (u32, &'a MState)> + Clone, reuse: Option<Packed>) -> Option<Packed> {
        let mut cvs = Seen::new();
        let mut ntail = 0;
        let nparts = walk(parts.clone(), |c| cvs.index_of(c), |_| ntail += 1)?;
        if (nparts >> 32) != 0 || cvs.seen().any(|(c, _)| !c.acc.is_empty()) {
            return None;
        }
        let mut evs = Seen::new();
        for (c, _) in cvs.seen() {
            for cap in c.v.iter() {
                evs.index_of(&cap.ev)?;
            }
        }
        let len = 1 + cvs.seen().map(|(c, _)| 1 + 2 * c.v.len()).sum::<usize>() + ntail;
        let (old_words, old_evs) = reuse.map_or((None, None), |p| (Some(p.words), Some(p.evs)));
        let mut words = old_words.filter(|w| w.len() == len).unwrap_or_else(|| vec![0; len].into_boxed_slice());
        let mut at = 0;
        let mut put = |x: u64| {
            words[at] = x;
            at += 1;
        };
        put(nparts | (cvs.n as u64) << 32);
        for (c, uses) in cvs.seen() {
            put(c.v.len() as u64 | uses << 32);
            for cap in c.v.iter() {
                put(u64::from(cap.var) | evs.find(&cap.ev)? << 32);
                put(cap.row as u64);
            }
        }
        walk(parts, |c| cvs.find(c), &mut put)?;
        // Every word written: none left from the block written over.
        debug_assert_eq!(at, len, "pack.rs: the words counted are the words written");
        let evs = match old_evs {
            Some(mut old) if old.len() == evs.n => {
                for (o, (e, _)) in old.iter_mut().zip(evs.seen()) {
                    if !Ev::ptr_eq(o, e) {
                        *o = e.clone();
                    }
                }
                old
            }
            _ => evs.seen().map(|(e, _)| e.clone()).collect(),
        };
        Some(Packed { words, evs })
    }

    /// The states again, each made into a `P` by `mk` (fingerprint, state): vectors of their
    /// length, shared captures shared, the same events.
    pub fn unpack<P>(&self, mut mk: impl FnMut(u32, MState) -> P) -> Vec<P> {
        let w = &self.words;
        let (nparts, ncv) = ((w[0] & 0xffff_ffff) as usize, (w[0] >> 32) as usize);
        let mut at = 1;
        // Each vector with the uses left: its last use takes it (no count written and dropped).
        // On the stack up to 8 vectors (a fraud card has one): no block allocated and freed
        // per unpack, and few slots to drop (a `MAX_SHARED` array's drop loop showed in the profile).
        let (mut small, mut big): ([(Option<Caps>, u64); 8], Vec<_>) = Default::default();
        let cvs = if ncv <= small.len() {
            &mut small[..ncv]
        } else {
            big.resize(ncv, (None, 0));
            &mut big[..]
        };
        for cv in cvs.iter_mut() {
            let (n, uses) = ((w[at] & 0xffff_ffff) as usize, w[at] >> 32);
            at += 1;
            let v = w[at..at + 2 * n]
                .chunks_exact(2)
                .map(|c| Cap { var: c[0] as u32, row: c[1] as i64, ev: self.evs[(c[0] >> 32) as usize].clone() })
                .collect();
            at += 2 * n;
            *cv = (Some(Caps::new(CapVec { v, acc: Vec::new() })), uses);
        }
        let mut take = |i: u64| {
            let c = &mut cvs[i as usize];
            c.1 -= 1;
            match c.1 {
                0 => c.0.take(),
                _ => c.0.clone(),
            }
            .expect("pack.rs: a capture vector used as often as counted")
        };
        let mut out = Vec::with_capacity(nparts);
        for _ in 0..nparts {
            let (head, row, deadline) = (w[at], w[at + 1] as i64, w[at + 2] as i64);
            at += 3;
            let nruns = ((head >> 32) & 0x7fff_ffff) as usize;
            let mut runs = Vec::with_capacity(nruns);
            for _ in 0..nruns {
                let (start, flags) = (w[at] as i64, w[at + 1]);
                at += 2;
                let n = (flags & 0xffff_ffff) as usize;
                let entries = w[at..at + n].iter().map(|&e| Entry { pos: e as u32 as i32, caps: take(e >> 32) }).collect();
                at += n;
                let tpart = (flags & HAS_TPART != 0).then(|| take(flags >> 34));
                runs.push(Run { start, entries, tpart, matched: flags & MATCHED != 0 });
            }
            let deadline = (head & HAS_DEADLINE != 0).then_some(deadline);
            out.push(mk(head as u32, MState { row, runs, deadline }));
        }
        out
    }

    /// Whether advancing the key without new events reports nothing and leaves nothing, at
    /// the end of input (`by` None) or by time up to `by`: each part's rule (by fingerprint,
    /// `core_of`) wants no timeouts, no run holds a timed-out part (`tpart`), no entry is
    /// complete (`DONE`, a match waiting to be decided) or at an absence (`-> NOT`, completed
    /// by the end or by time), and by time every entry's deadline (`Core::deadline_at`, from its
    /// captures' times) is at most `by`. `Core::advance` then drops every entry and
    /// `Core::settle` every run, silently (`Core::on_end` at the end of input the same).
    /// Some(the parts of no rule of the key's group: dropped as reset), else None.
    pub fn ends_quietly<'c>(&self, core_of: impl Fn(u32) -> Option<&'c Core>, by: Option<i64>) -> Option<usize> {
        let w = &self.words;
        let ncv = (w[0] >> 32) as usize;
        // Where each capture vector's length word is (at most `MAX_SHARED` vectors).
        let mut cv_at = [0usize; MAX_SHARED];
        let mut at = 1;
        for c in cv_at.iter_mut().take(ncv) {
            *c = at;
            at += 1 + 2 * (w[at] & 0xffff_ffff) as usize;
        }
        let ts_of = |cap_word: u64| self.evs[(cap_word >> 32) as usize].ts;
        let mut reset = 0;
        for _ in 0..(w[0] & 0xffff_ffff) {
            let head = w[at];
            at += 3;
            let core = core_of(head as u32);
            reset += usize::from(core.is_none());
            if core.is_some_and(|c| c.want_timeouts) {
                return None;
            }
            for _ in 0..((head >> 32) & 0x7fff_ffff) {
                let flags = w[at + 1];
                let n = (flags & 0xffff_ffff) as usize;
                if let Some(c) = core {
                    let loud = |&e: &u64| {
                        let pos = e as u32 as i32;
                        if pos == DONE || c.p.table[pos as usize].absence {
                            return true;
                        }
                        let Some(by) = by else { return false };
                        let cv = cv_at[(e >> 32) as usize];
                        let len = (w[cv] & 0xffff_ffff) as usize;
                        if len == 0 {
                            return true;
                        }
                        let deadline = c.deadline_at(|| ts_of(w[cv + 1]), || ts_of(w[cv + 2 * len - 1]));
                        deadline.is_none_or(|d| d > by)
                    };
                    if flags & HAS_TPART != 0 || w[at + 2..at + 2 + n].iter().any(loud) {
                        return None;
                    }
                }
                at += 2 + n;
            }
        }
        Some(reset)
    }

    /// The two blocks' first lines and the events' (`prefetch_ahead`), as pointers.
    pub fn blocks(&self) -> (*const u64, &[Ev]) {
        (self.words.as_ptr(), &self.evs)
    }

    /// The words' and the events' bytes (tests, sizes).
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        (self.words.len() * 8, self.evs.len() * 8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use crate::expr::{Cols, Row};
    use crate::value::Value;

    fn ev(ts: i64) -> Ev {
        let cols = Arc::new(Cols { names: vec!["card".into(), "amount".into()], py_names: Vec::new() });
        let row = Row { cols, vals: vec![Value::Str(Arc::from("card-1")), Value::Int(ts * 10)] };
        Ev::from_row(row, None, ts + 1, ts, Arc::from([0u32, 1]))
    }

    fn caps(v: &[(u32, i64, &Ev)]) -> Caps {
        Caps::new(CapVec::from(v.iter().map(|&(var, row, ev)| Cap { var, row, ev: ev.clone() }).collect::<Vec<_>>()))
    }

    /// The states' shape and contents, with sharing as indexes (captures by pointer to their
    /// vector, events by pointer), so that two round trips compare equal.
    fn shape(parts: &[(u32, MState)]) -> String {
        let mut cvs: Vec<Caps> = Vec::new();
        let mut out = String::new();
        for (fp, m) in parts {
            out += &format!("part {fp} row {} deadline {:?}\n", m.row, m.deadline);
            for r in &m.runs {
                let mut cv = |c: &Caps| {
                    let i = cvs.iter().position(|x| Caps::ptr_eq(x, c)).unwrap_or_else(|| {
                        cvs.push(c.clone());
                        cvs.len() - 1
                    });
                    let v: Vec<_> = c.v.iter().map(|x| (x.var, x.row, x.ev.as_ptr() as usize, x.ev.ts)).collect();
                    format!("cv{i} {v:?}")
                };
                out += &format!(" run {} matched {} tpart {:?}\n", r.start, r.matched, r.tpart.as_ref().map(&mut cv));
                for e in &r.entries {
                    out += &format!("  entry {} {}\n", e.pos, cv(&e.caps));
                }
            }
        }
        out
    }

    fn round_trip(parts: &[(u32, MState)]) -> Packed {
        let p = Packed::pack(parts.iter().map(|(fp, m)| (*fp, m)), None).expect("packs");
        let back = p.unpack(|fp, m| (fp, m));
        assert_eq!(shape(&back), shape(parts));
        let again = Packed::pack(back.iter().map(|(fp, m)| (*fp, m)), None).expect("packs");
        assert_eq!(again.words, p.words);
        p
    }

    /// The fraud card at rest: one part, one run, one entry, one capture: 10 words and one event.
    #[test]
    fn the_usual_card_packs_into_ten_words_and_one_event() {
        let e = ev(5);
        let m = MState { row: 1, runs: vec![Run { start: 0, entries: vec![Entry { pos: 1, caps: caps(&[(0, 0, &e)]) }], tpart: None, matched: false }], deadline: Some(3_600_005) };
        let p = round_trip(&[(0xdead_beef, m)]);
        assert_eq!(p.sizes(), (80, 8));
    }

    /// Shared captures stay shared (one vector), an event captured twice is one, `tpart`s and
    /// negative values, parts without a deadline or runs, several parts.
    #[test]
    fn shared_captures_tparts_and_deadlines_round_trip() {
        let (a, b, c) = (ev(1), ev(2), ev(-3));
        let shared = caps(&[(0, 0, &a), (1, 1, &b)]);
        let m1 = MState {
            row: 7,
            runs: vec![
                Run {
                    start: 0,
                    entries: vec![
                        Entry { pos: 2, caps: shared.clone() },
                        Entry { pos: -1, caps: shared.clone() },
                        Entry { pos: crate::program::DONE, caps: caps(&[(0, 0, &a), (2, 5, &c), (2, 6, &c)]) },
                    ],
                    tpart: Some(shared.clone()),
                    matched: true,
                },
                Run { start: 3, entries: vec![Entry { pos: 0, caps: Caps::new(CapVec::default()) }], tpart: Some(caps(&[(1, 4, &b)])), matched: false },
            ],
            deadline: Some(-42),
        };
        let m2 = MState { row: 0, runs: Vec::new(), deadline: None };
        let m3 = MState { row: i64::MAX, runs: vec![Run { start: i64::MIN, entries: Vec::new(), tpart: None, matched: false }], deadline: Some(i64::MIN) };
        let p = round_trip(&[(1, m1), (u32::MAX, m2), (2, m3)]);
        assert_eq!(p.evs.len(), 3, "each event once");
        let back = p.unpack(|_, m| m);
        assert!(Caps::ptr_eq(&back[0].runs[0].entries[0].caps, &back[0].runs[0].entries[1].caps));
        assert!(Caps::ptr_eq(&back[0].runs[0].entries[0].caps, back[0].runs[0].tpart.as_ref().expect("tpart")));
        assert!(Ev::ptr_eq(&back[0].runs[0].entries[2].caps.v[1].ev, &c));
        assert!(back.iter().flat_map(|m| &m.runs).all(|r| r.entries.capacity() == r.entries.len()));
    }

    /// A packing written into the blocks of the key's last one (`reuse`) is the packing made
    /// afresh, whether the words and events are as many (the blocks written over), more or
    /// fewer (new blocks), or the events change: a steady key's repack, a key that grows, one
    /// that shrinks back, shared captures, more capture vectors than `unpack` keeps on the stack,
    /// as many words with more events and as many events with more words (each block reused
    /// on its own count).
    #[test]
    fn packing_into_the_last_blocks_equals_packing_afresh() {
        let (a, b, c) = (ev(1), ev(2), ev(3));
        let one = |e: &Ev, row| MState { row, runs: vec![Run { start: row - 1, entries: vec![Entry { pos: 1, caps: caps(&[(0, row - 1, e)]) }], tpart: None, matched: false }], deadline: Some(row * 7) };
        let shared = caps(&[(0, 4, &b), (1, 5, &c)]);
        let grown = MState {
            row: 6,
            runs: vec![
                Run { start: 4, entries: vec![Entry { pos: 2, caps: shared.clone() }, Entry { pos: DONE, caps: shared.clone() }], tpart: Some(shared.clone()), matched: true },
                Run { start: 5, entries: vec![Entry { pos: 1, caps: caps(&[(0, 5, &c)]) }], tpart: None, matched: false },
            ],
            deadline: None,
        };
        // More capture vectors than `unpack` keeps on the stack.
        let entries = (0..10).map(|i| Entry { pos: i, caps: caps(&[(0, i64::from(i), if i % 2 == 0 { &a } else { &c })]) }).collect();
        let many = MState { row: 10, runs: vec![Run { start: 0, entries, tpart: None, matched: false }], deadline: Some(1) };
        // Two captures: 12 words with one event or two.
        let two = |e: &Ev, f: &Ev| MState { row: 3, runs: vec![Run { start: 1, entries: vec![Entry { pos: 2, caps: caps(&[(0, 1, e), (1, 2, f)]) }], tpart: None, matched: false }], deadline: Some(9) };
        // As many words, another header: `n` entries sharing one vector of two captures (13
        // words with 2, 14 with 3), one capture and a part without runs (13), two vectors (14).
        let sharing = |n: usize| {
            let cv = caps(&[(0, 1, &a), (1, 2, &b)]);
            MState { row: 4, runs: vec![Run { start: 1, entries: (0..n).map(|_| Entry { pos: 2, caps: cv.clone() }).collect(), tpart: None, matched: false }], deadline: None }
        };
        let no_runs = MState { row: 5, runs: Vec::new(), deadline: None };
        let two_vectors = MState { row: 6, runs: vec![Run { start: 2, entries: vec![Entry { pos: 1, caps: caps(&[(0, 2, &c)]) }, Entry { pos: 2, caps: caps(&[(1, 3, &a)]) }], tpart: None, matched: false }], deadline: None };
        let states = [
            vec![(9, one(&a, 2))],
            vec![(9, one(&b, 3))],
            vec![(9, one(&b, 4))],
            vec![(9, grown), (8, one(&a, 1))],
            vec![(9, one(&c, 8))],
            vec![(9, many)],
            vec![(9, one(&a, 11))],
            vec![(9, two(&a, &a))],
            vec![(9, two(&a, &b))],
            vec![(9, two(&b, &a))],
            vec![(9, one(&c, 12))],
            vec![(9, sharing(2))],
            vec![(9, one(&b, 13)), (8, no_runs)],
            vec![(9, sharing(3))],
            vec![(9, two_vectors)],
        ];
        let pack = |s: &[(u32, MState)], reuse| Packed::pack(s.iter().map(|(fp, m)| (*fp, m)), reuse).expect("packs");
        let mut last = pack(&states[0], None);
        for s in &states[1..] {
            let fresh = pack(s, None);
            let (same_len, same_evs) = (last.words.len() == fresh.words.len(), last.evs.len() == fresh.evs.len());
            let before = (last.words.as_ptr(), last.evs.as_ptr());
            let p = pack(s, Some(last));
            assert_eq!(p.words, fresh.words);
            assert_eq!(p.evs.iter().map(Ev::as_ptr).collect::<Vec<_>>(), fresh.evs.iter().map(Ev::as_ptr).collect::<Vec<_>>());
            assert_eq!(shape(&p.unpack(|fp, m| (fp, m))), shape(s));
            // (Not the converse: a new block may be given the freed one's address.)
            assert!(!same_len || std::ptr::eq(p.words.as_ptr(), before.0), "words written over when as many");
            assert!(!same_evs || std::ptr::eq(p.evs.as_ptr(), before.1), "events written over when as many");
            last = p;
        }
    }

    /// What stays live: captures with running aggregates, more shared vectors than `MAX_SHARED`.
    #[test]
    fn aggregates_and_many_vectors_stay_live() {
        let e = ev(1);
        let mut cv = CapVec::from(vec![Cap { var: 0, row: 0, ev: e.clone() }]);
        cv.acc.push(crate::expr::Acc { n: 1, fold: crate::expr::Fold::Empty, broken: false });
        let m = MState { row: 1, runs: vec![Run { start: 0, entries: vec![Entry { pos: 1, caps: Caps::new(cv) }], tpart: None, matched: false }], deadline: None };
        assert!(Packed::pack([(0, &m)].into_iter(), None).is_none());
        let entries = (0..=MAX_SHARED).map(|i| Entry { pos: i as i32, caps: caps(&[(0, 0, &e)]) }).collect();
        let m = MState { row: 1, runs: vec![Run { start: 0, entries, tpart: None, matched: false }], deadline: None };
        assert!(Packed::pack([(0, &m)].into_iter(), None).is_none());
    }
}
