//! The keys of an engine's state (docs/native-core.md, "Many keys"): each (group, key text)
//! has a small integer id while it has state, its value lives in one slot of a slab (no map of
//! boxed states, no key text hashed again after the event's lookup), and the wake index is a
//! calendar of coarse time buckets holding ids (no heap entry, no key clone per deadline).
//!
//! Ids are reused: `release` frees a key's id and slot for the next new key. The wake index
//! keeps one time per key (`set_wake` replaces it); `pop_due` returns the keys due by a time,
//! in no particular order (the engine orders its output by key itself).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::engine::AT_END;
use crate::keytable::{hash32, Named, Table, VACANT};

pub type Id = u32;

/// More keys with state at once than an `Id` can number.
#[derive(Debug)]
pub struct TooManyKeys;

impl std::fmt::Display for TooManyKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "more than 2^32 keys with state in one engine state: spread the keys over more shards")
    }
}

/// A slot's `queued` when the key is not in the wake index.
const NOT_QUEUED: i64 = i64::MIN;
/// A slot's `group` when the slot is free.
const FREE: u32 = u32::MAX;
/// A slot's `queued` when the key waits for the end of input (`AT_END` or later): such keys
/// are kept out of the calendar, in `parked` (with many idle keys they would all share one
/// bucket that every `next_due` would scan).
const PARKED: i64 = i64::MIN + 1;
/// Wake times are filed by `time >> SHIFT` (buckets of 1,024 ms of event time).
const SHIFT: u32 = 10;

/// One bucket of the wake index: ids filed there (some stale), a lower bound of the wakes of
/// its live ids (lowered whenever an id is filed or moves earlier in it) and the id that set it: while
/// that id is still queued here at that time the bound is the bucket's earliest wake; only
/// after it leaves or moves later is the bucket scanned again (`refresh`).
struct Bucket {
    ids: Vec<Id>,
    min: i64,
    holder: Id,
}

impl Bucket {
    fn empty() -> Self {
        Bucket { ids: Vec::new(), min: i64::MAX, holder: 0 }
    }

    /// File `id` (due at `when`) here.
    fn push(&mut self, id: Id, when: i64) {
        self.ids.push(id);
        self.lower(id, when);
    }

    /// `id` (live here) is now due at `when`.
    fn lower(&mut self, id: Id, when: i64) {
        if when <= self.min {
            (self.min, self.holder) = (when, id);
        }
    }

    /// Make `min` the earliest wake of the live ids (those whose slot says `b`) if its holder
    /// no longer has it, dropping the stale entries; returns the stale entries dropped.
    fn refresh<V>(&mut self, b: i64, slots: &[Slot<V>]) -> usize {
        if slots.get(self.holder as usize).is_some_and(|s| s.queued == b && s.wake == self.min) {
            return 0;
        }
        let before = self.ids.len();
        self.ids.retain(|&id| queued_in(slots, id, b));
        let m = self.ids.iter().map(|&id| (slots[id as usize].wake, id)).min();
        (self.min, self.holder) = m.unwrap_or((i64::MAX, 0));
        before - self.ids.len()
    }
}

/// Aligned to a cache line: a slot of 128 bytes (the engine's) is two lines, never three.
#[repr(align(64))]
pub struct Slot<V> {
    pub key: Arc<str>,
    pub group: u32,
    /// The key's text hash (`Named::h`): what finds its entry when the key is released.
    h: u32,
    /// When the key is due (meaningful while `queued != NOT_QUEUED`).
    wake: i64,
    /// The bucket holding the key's live entry in the wake index (`NOT_QUEUED`: none). Other
    /// entries of the id in other buckets are stale and skipped.
    queued: i64,
    pub val: V,
}

/// Ask for every line of a slot (two for the engine's, which are line-aligned).
fn prefetch_slot<V>(s: &Slot<V>) {
    let p = (s as *const Slot<V>).cast::<u8>();
    for off in (0..std::mem::size_of::<Slot<V>>()).step_by(64) {
        prefetch(p.wrapping_add(off));
    }
}

pub struct Keys<V> {
    slots: Vec<Slot<V>>,
    /// Free ids below `slots.len()` (the lowest is handed out first; free slots at the tail are
    /// cut off, so the slab shrinks as keys go).
    free: FreeIds,
    /// Per group, the ids of its keys by text (8 bytes a bucket; the texts are in the slots).
    by_text: Vec<Table>,
    hasher: foldhash::fast::RandomState,
    /// The wake index: bucket → ids filed there (some stale). A hash map: with many keys nearly
    /// every `set_wake` files its key in another bucket, and a `BTreeMap`'s search there was
    /// ~2% of the 1M-card run (docs/native-core.md, "the key table (session 19, core19t)").
    buckets: HashMap<i64, Bucket, foldhash::fast::RandomState>,
    /// The buckets of `buckets` in time order (changed only when a bucket is made or emptied).
    order: BTreeSet<i64>,
    /// Ids waiting for the end of input (some stale: live while their slot says `PARKED`).
    parked: Bucket,
    /// Live ids in `parked`.
    nparked: usize,
    /// Entries in `buckets` and `parked`, live or stale (rebuilt when stale ones dominate).
    entries: usize,
    /// Keys in the wake index.
    waiting: usize,
    empty: Arc<str>,
}

impl<V: Default> Default for Keys<V> {
    fn default() -> Self {
        Keys {
            slots: Vec::new(),
            free: FreeIds::default(),
            by_text: Vec::new(),
            hasher: Default::default(),
            buckets: HashMap::default(),
            order: BTreeSet::new(),
            parked: Bucket::empty(),
            nparked: 0,
            entries: 0,
            waiting: 0,
            empty: Arc::from(""),
        }
    }
}

impl<V: Default> Keys<V> {
    /// The id of `key` in `group`, made (with a default value) if the key has none; an error
    /// past 2^32 keys with state at once.
    pub fn intern(&mut self, group: u32, key: &Arc<str>) -> Result<Id, TooManyKeys> {
        let h = self.hash(key);
        self.intern_hashed(group, key, h)
    }

    /// `intern` given the key's text hash `h` (a test gives keys the same hash).
    fn intern_hashed(&mut self, group: u32, key: &Arc<str>, h: u32) -> Result<Id, TooManyKeys> {
        let g = group as usize;
        if self.by_text.len() <= g {
            self.by_text.resize_with(g + 1, Table::default);
        }
        if let Some(id) = self.lookup(g, key, h) {
            return Ok(id);
        }
        let slot = Slot { key: key.clone(), group, h, wake: 0, queued: NOT_QUEUED, val: V::default() };
        let id = match self.free.pop_first() {
            Some(id) => {
                self.slots[id as usize] = slot;
                id
            }
            None => {
                let id = Id::try_from(self.slots.len()).ok().filter(|&id| id != VACANT).ok_or(TooManyKeys)?;
                self.slots.push(slot);
                id
            }
        };
        self.by_text[g].insert(Named { id, h });
        Ok(id)
    }

    fn hash(&self, key: &str) -> u32 {
        self.hash_bytes(key.as_bytes())
    }

    /// The id of `key` (hash `h`) in group `g`, if it has one.
    fn lookup(&self, g: usize, key: &str, h: u32) -> Option<Id> {
        let slots = &self.slots;
        let t = self.by_text.get(g)?;
        t.get(h, |id| *slots[id as usize].key == *key)
    }

    pub fn find(&self, group: u32, key: &str) -> Option<Id> {
        self.lookup(group as usize, key, self.hash(key))
    }

    /// Forget the key: its id and slot are free for another key.
    pub fn release(&mut self, id: Id) {
        self.discard_wake(id);
        let empty = self.empty.clone();
        let s = &mut self.slots[id as usize];
        if s.group == FREE {
            return;
        }
        if let Some(t) = self.by_text.get_mut(s.group as usize) {
            if let Some(i) = t.find(s.h, |e| e == id) {
                t.remove_at(i);
            }
        }
        s.key = empty;
        s.group = FREE;
        s.val = V::default();
        self.free.insert(id);
        while self.slots.len().checked_sub(1).is_some_and(|last| self.free.contains(last as Id)) {
            self.free.remove((self.slots.len() - 1) as Id);
            self.slots.pop();
        }
        if self.slots.capacity() > 1024 && self.slots.len() < self.slots.capacity() / 4 {
            self.slots.shrink_to(self.slots.len() * 2);
        }
    }

    /// The text hash of a key: `intern` and `find` hash the same bytes (`prefetch_table`).
    pub fn hash_bytes(&self, key: &[u8]) -> u32 {
        hash32(&self.hasher, key)
    }

    /// Ask for the table line where a key of hash `h` of `group` is looked up (a hint, like
    /// the others: the caller interns the key a few events later).
    pub fn prefetch_table(&self, group: u32, h: u32) {
        if let Some(t) = self.by_text.get(group as usize) {
            prefetch(t.line(h));
        }
    }

    /// Ask for the slot of the key of hash `h` in `group` (its table line asked for earlier),
    /// and with `text` the key's text, which the slot names (the slot asked for earlier).
    pub fn prefetch_named(&self, group: u32, h: u32, text: bool) {
        let Some(t) = self.by_text.get(group as usize) else { return };
        let Some(id) = t.get(h, |_| true) else { return };
        let Some(s) = self.slots.get(id as usize) else { return };
        if text {
            prefetch(Arc::as_ptr(&s.key).cast::<u8>());
        } else {
            prefetch_slot(s);
        }
    }

    /// Ask for the table line of the key `id` (what its release reads: its slot asked for
    /// earlier).
    pub fn prefetch_entry(&self, id: Id) {
        if let Some(s) = self.slots.get(id as usize).filter(|s| s.group != FREE) {
            self.prefetch_table(s.group, s.h);
        }
    }

    /// Ask the CPU to load the key's slot (a hint: the caller reaches it a few keys later).
    pub fn prefetch(&self, id: Id) {
        if let Some(s) = self.slots.get(id as usize) {
            prefetch_slot(s);
        }
    }

    pub fn slot(&self, id: Id) -> &Slot<V> {
        &self.slots[id as usize]
    }

    pub fn val_mut(&mut self, id: Id) -> &mut V {
        &mut self.slots[id as usize].val
    }

    /// The ids in use, in id order.
    pub fn ids(&self) -> impl Iterator<Item = Id> + '_ {
        self.slots.iter().enumerate().filter(|(_, s)| s.group != FREE).map(|(i, _)| i as Id)
    }

    /// The number of keys with an id.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.n
    }

    /// The key is due at `when` (replacing its earlier time).
    pub fn set_wake(&mut self, id: Id, when: i64) {
        let b = if when >= AT_END { PARKED } else { when >> SHIFT };
        let s = &mut self.slots[id as usize];
        let was = s.queued;
        let earlier = when < s.wake;
        s.wake = when;
        if was == b {
            // Later in the same bucket: the bound still holds (no lookup).
            if earlier {
                match self.buckets.get_mut(&b) {
                    Some(k) => k.lower(id, when),
                    None => self.parked.lower(id, when),
                }
            }
            return;
        }
        s.queued = b;
        self.left(was);
        self.waiting += 1;
        if b == PARKED {
            self.parked.push(id, when);
            self.nparked += 1;
        } else {
            let order = &mut self.order;
            self.buckets.entry(b).or_insert_with(|| {
                order.insert(b);
                Bucket::empty()
            }).push(id, when);
        }
        self.entries += 1;
        if self.entries > 2 * self.waiting + 64 {
            self.rebuild();
        }
    }

    /// A key is no longer queued in `b` (its entry there is stale; the bucket's bound holds).
    fn left(&mut self, b: i64) {
        match b {
            NOT_QUEUED => return,
            PARKED => self.nparked -= 1,
            _ => {}
        }
        self.waiting -= 1;
    }

    pub fn discard_wake(&mut self, id: Id) {
        let s = &mut self.slots[id as usize];
        let b = std::mem::replace(&mut s.queued, NOT_QUEUED);
        self.left(b);
    }

    pub fn wake_of(&self, id: Id) -> Option<i64> {
        let s = &self.slots[id as usize];
        (s.queued != NOT_QUEUED).then_some(s.wake)
    }

    /// The time the key was last set due at (kept after it is taken out of the wake index).
    pub fn last_wake(&self, id: Id) -> i64 {
        self.slots[id as usize].wake
    }

    /// The number of keys in the wake index.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Append to `out` the keys due at or before `top` (taken out of the wake index).
    pub fn pop_due(&mut self, top: i64, out: &mut Vec<Id>) {
        let last = top >> SHIFT;
        let slots = &mut self.slots;
        while let Some(&b) = self.order.first() {
            let k = self.buckets.get_mut(&b).expect("every bucket in `order` is in `buckets`");
            if b > last || k.min > top {
                break;
            }
            let before = k.ids.len();
            // Every live entry of a bucket before `last` is due; in `last`'s, those up to `top`
            // (the others give the bucket's new minimum).
            let (mut min, mut holder) = (i64::MAX, 0);
            k.ids.retain(|&id| {
                let Some(s) = slots.get_mut(id as usize).filter(|s| s.queued == b) else {
                    return false;
                };
                if s.wake <= top {
                    s.queued = NOT_QUEUED;
                    self.waiting -= 1;
                    out.push(id);
                    return false;
                }
                if s.wake < min {
                    (min, holder) = (s.wake, id);
                }
                true
            });
            let gone = before - k.ids.len();
            self.entries -= gone;
            (k.min, k.holder) = (min, holder);
            if !k.ids.is_empty() {
                break;
            }
            // The first bucket, emptied.
            self.buckets.remove(&b);
            self.order.pop_first();
        }
        if top >= AT_END && self.nparked > 0 {
            let before = self.parked.ids.len();
            self.parked.ids.retain(|&id| {
                let Some(s) = slots.get_mut(id as usize).filter(|s| s.queued == PARKED) else {
                    return false;
                };
                if s.wake <= top {
                    s.queued = NOT_QUEUED;
                    self.waiting -= 1;
                    self.nparked -= 1;
                    out.push(id);
                    return false;
                }
                true
            });
            self.entries -= before - self.parked.ids.len();
        }
    }

    /// Append every key of the wake index to `out` (which is left empty).
    pub fn pop_all(&mut self, out: &mut Vec<Id>) {
        let slots = &mut self.slots;
        // In any order: `out` is in no particular order.
        let filed = self.buckets.iter().map(|(&b, k)| (b, &k.ids)).chain(std::iter::once((PARKED, &self.parked.ids)));
        for (b, ids) in filed {
            for &id in ids {
                if let Some(s) = slots.get_mut(id as usize).filter(|s| s.queued == b) {
                    s.queued = NOT_QUEUED;
                    out.push(id);
                }
            }
        }
        self.buckets.clear();
        self.order.clear();
        self.parked = Bucket::empty();
        self.nparked = 0;
        self.entries = 0;
        self.waiting = 0;
    }

    /// The earliest wake time.
    pub fn next_due(&mut self) -> Option<i64> {
        let slots = &self.slots;
        while let Some(&b) = self.order.first() {
            let k = self.buckets.get_mut(&b).expect("every bucket in `order` is in `buckets`");
            self.entries -= k.refresh(b, slots);
            if !k.ids.is_empty() {
                return Some(k.min);
            }
            // The first bucket, emptied.
            self.buckets.remove(&b);
            self.order.pop_first();
        }
        if self.nparked == 0 {
            return None;
        }
        self.entries -= self.parked.refresh(PARKED, slots);
        Some(self.parked.min)
    }

    /// Drop the stale entries (and repeated ones) from every bucket: O(entries), not O(slots).
    fn rebuild(&mut self) {
        let slots = &self.slots;
        let filed = self.buckets.iter_mut().map(|(&b, k)| (b, k)).chain(std::iter::once((PARKED, &mut self.parked)));
        let mut entries = 0;
        for (b, k) in filed {
            k.ids.retain(|&id| queued_in(slots, id, b));
            k.ids.sort_unstable();
            k.ids.dedup();
            k.holder = Id::MAX;
            k.refresh(b, slots);
            entries += k.ids.len();
        }
        self.buckets.retain(|_, k| !k.ids.is_empty());
        self.order.retain(|b| self.buckets.contains_key(b));
        self.entries = entries;
        debug_assert_eq!(self.entries, self.waiting);
    }
}

/// Free ids, lowest first: a bitmap (bit `id`) and a summary of its nonzero words, so that
/// freeing an id is a bit set (a `BTreeSet` insert was ~5% of a call that released 1M keys) and
/// the lowest is found by a short scan from `lo`.
#[derive(Default)]
struct FreeIds {
    words: Vec<u64>,
    /// Bit w: `words[w]` is not zero.
    summary: Vec<u64>,
    /// Every summary word before `lo` is zero.
    lo: usize,
    n: usize,
}

impl FreeIds {
    fn contains(&self, id: Id) -> bool {
        let (w, b) = (id as usize / 64, id % 64);
        self.words.get(w).is_some_and(|x| x >> b & 1 == 1)
    }

    fn insert(&mut self, id: Id) {
        let (w, b) = (id as usize / 64, id % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
            self.summary.resize(w / 64 + 1, 0);
        }
        if self.words[w] >> b & 1 == 0 {
            self.words[w] |= 1 << b;
            self.summary[w / 64] |= 1 << (w % 64);
            self.lo = self.lo.min(w / 64);
            self.n += 1;
        }
    }

    fn remove(&mut self, id: Id) {
        let (w, b) = (id as usize / 64, id % 64);
        if self.contains(id) {
            self.words[w] &= !(1 << b);
            if self.words[w] == 0 {
                self.summary[w / 64] &= !(1 << (w % 64));
            }
            self.n -= 1;
        }
    }

    fn pop_first(&mut self) -> Option<Id> {
        if self.n == 0 {
            return None;
        }
        let s = self.lo + self.summary[self.lo..].iter().position(|&x| x != 0)?;
        self.lo = s;
        let w = s * 64 + self.summary[s].trailing_zeros() as usize;
        let id = (w * 64) as Id + self.words[w].trailing_zeros();
        self.remove(id);
        Some(id)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.n == 0
    }
}

/// Whether `id`'s live entry in the wake index is in bucket `b` (`PARKED`: the parked list).
fn queued_in<V>(slots: &[Slot<V>], id: Id, b: i64) -> bool {
    slots.get(id as usize).is_some_and(|s| s.queued == b)
}

/// A prefetch hint for the cache line at `p` (any address: a prefetch never faults).
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` only hints the cache; it reads nothing and cannot fault.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny deterministic generator (no dependency for tests).
    pub(crate) struct Lcg(pub(crate) u64);
    impl Lcg {
        pub(crate) fn next(&mut self, n: u64) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }
    }

    fn key(i: u64) -> Arc<str> {
        Arc::from(format!("k{i}"))
    }

    #[test]
    fn release_and_recreate_reuse_ids_and_reset_values() {
        let mut k: Keys<Vec<u32>> = Keys::default();
        let a = k.intern(0, &key(1)).unwrap();
        let b = k.intern(1, &key(1)).unwrap();
        assert_ne!(a, b, "the same text in two groups is two keys");
        assert_eq!(k.intern(0, &key(1)).unwrap(), a);
        k.val_mut(a).push(7);
        k.set_wake(a, 100);
        k.release(a);
        assert_eq!(k.find(0, "k1"), None);
        assert_eq!(k.wake_of(a), None);
        assert_eq!(k.waiting(), 0);
        assert_eq!(k.len(), 1);
        let c = k.intern(0, &key(2)).unwrap();
        assert_eq!(c, a, "a freed id is reused");
        assert!(k.slot(c).val.is_empty(), "a reused slot starts empty");
        assert_eq!(&*k.slot(c).key, "k2");
        assert_eq!(k.find(0, "k2"), Some(c));
        assert_eq!(k.find(1, "k1"), Some(b));
        k.release(c);
        k.release(c);
        assert_eq!(k.len(), 1, "releasing twice frees once");
        assert_eq!(k.ids().collect::<Vec<_>>(), vec![b]);
    }

    /// Random interns, finds and releases over two groups against a plain map: every key is
    /// found under its own id while it has one (ids reused, tables grown and emptied).
    #[test]
    fn key_table_agrees_with_a_map() {
        let mut rng = Lcg(7);
        let mut k: Keys<u64> = Keys::default();
        let mut model: std::collections::HashMap<(u32, u64), Id> = Default::default();
        for step in 0..300_000 {
            let (g, i) = (rng.next(2) as u32, rng.next(40_000));
            match rng.next(4) {
                0 | 1 => {
                    let id = k.intern(g, &key(i)).unwrap();
                    if let Some(&was) = model.get(&(g, i)) {
                        assert_eq!(id, was, "step {step}");
                    } else {
                        *k.val_mut(id) = i;
                        model.insert((g, i), id);
                    }
                }
                2 => {
                    if let Some(id) = model.remove(&(g, i)) {
                        k.release(id);
                    }
                }
                _ => {
                    let got = k.find(g, &format!("k{i}"));
                    assert_eq!(got, model.get(&(g, i)).copied(), "step {step}");
                    if let Some(id) = got {
                        assert_eq!(k.slot(id).val, i, "step {step}: another key's slot");
                        assert_eq!(k.slot(id).group, g);
                    }
                }
            }
            if step % 50_000 == 0 {
                assert_eq!(k.len(), model.len());
            }
        }
        for (&(g, i), &id) in &model {
            assert_eq!(k.find(g, &format!("k{i}")), Some(id));
        }
        assert_eq!(k.by_text.iter().map(|t| t.len).sum::<usize>(), model.len());
    }

    /// Keys whose 32-bit hashes are all equal (in two groups) are told apart by their text:
    /// each is found under its own id, a release removes only its own entry, and a released
    /// key's reused id finds the new key, not the old.
    #[test]
    fn colliding_hashes_are_told_apart_by_text() {
        let mut k: Keys<u64> = Keys::default();
        let ids: Vec<(u32, u64, Id)> = (0..2000)
            .map(|i| (u32::from(i % 3 == 0), i, k.intern_hashed(u32::from(i % 3 == 0), &key(i), 7).unwrap()))
            .collect();
        for &(g, i, id) in &ids {
            assert_eq!(k.intern_hashed(g, &key(i), 7).unwrap(), id, "interned again: the same id");
            assert_eq!(k.lookup(g as usize, &format!("k{i}"), 7), Some(id));
            assert_eq!(k.lookup(1 - g as usize, &format!("k{i}"), 7), None, "not in the other group");
        }
        for &(_, _, id) in ids.iter().filter(|(_, i, _)| i % 2 == 1) {
            k.release(id);
        }
        for &(g, i, id) in &ids {
            let want = (i % 2 == 0).then_some(id);
            assert_eq!(k.lookup(g as usize, &format!("k{i}"), 7), want, "k{i}");
        }
        let new = k.intern_hashed(0, &key(5000), 7).unwrap();
        assert_eq!(new, ids[1].2, "the lowest released id is reused");
        assert_eq!(k.lookup(0, "k5000", 7), Some(new));
        assert_eq!(k.lookup(0, "k1", 7), None);
        assert_eq!(k.by_text.iter().map(|t| t.len).sum::<usize>(), 1001);
    }

    /// Random wake operations over many keys against a plain map: the same keys are due, the
    /// same earliest time, the same count.
    #[test]
    fn wake_index_agrees_with_a_map() {
        let mut rng = Lcg(42);
        let mut k: Keys<()> = Keys::default();
        let mut model: std::collections::BTreeMap<u64, i64> = Default::default();
        let mut ids = std::collections::HashMap::new();
        let mut top = -5_000i64;
        for step in 0..200_000 {
            let i = rng.next(3_000);
            let id = *ids.entry(i).or_insert_with(|| k.intern(0, &key(i)).unwrap());
            match rng.next(10) {
                0..=5 => {
                    let when = match rng.next(8) {
                        0 => AT_END,
                        1 => i64::MAX,
                        _ => top + rng.next(20_000) as i64 - 1_000,
                    };
                    k.set_wake(id, when);
                    model.insert(i, when);
                }
                6 => {
                    k.discard_wake(id);
                    model.remove(&i);
                }
                7 if step % 7 == 0 => {
                    k.release(id);
                    ids.remove(&i);
                    model.remove(&i);
                }
                _ => {
                    top += rng.next(3_000) as i64;
                    let mut due = Vec::new();
                    k.pop_due(top, &mut due);
                    let mut got: Vec<String> = due.iter().map(|&d| k.slot(d).key.to_string()).collect();
                    got.sort();
                    let mut want: Vec<String> =
                        model.iter().filter(|(_, &t)| t <= top).map(|(i, _)| format!("k{i}")).collect();
                    want.sort();
                    assert_eq!(got, want, "step {step}");
                    model.retain(|_, t| *t > top);
                    assert_eq!(k.next_due(), model.values().min().copied(), "step {step}");
                }
            }
            assert_eq!(k.waiting(), model.len());
            if step % 101 == 0 {
                // The buckets' order holds exactly the buckets of the map.
                let mut filed: Vec<i64> = k.buckets.keys().copied().collect();
                filed.sort_unstable();
                assert!(k.order.iter().copied().eq(filed), "step {step}");
            }
        }
        let mut due = Vec::new();
        k.pop_due(AT_END, &mut due);
        assert_eq!(due.len(), model.values().filter(|&&t| t <= AT_END).count());
        model.retain(|_, t| *t > AT_END);
        assert_eq!(k.next_due(), model.values().min().copied());
        let mut all = Vec::new();
        k.pop_all(&mut all);
        assert_eq!(all.len(), model.len());
        assert!(k.buckets.is_empty() && k.order.is_empty());
        assert_eq!(k.next_due(), None);
        assert!(k.entries <= 2 * 3_000 + 64);
    }

    #[test]
    fn negative_and_extreme_times_order() {
        let mut k: Keys<()> = Keys::default();
        let ids: Vec<Id> = (0..4).map(|i| k.intern(0, &key(i)).unwrap()).collect();
        k.set_wake(ids[0], i64::MAX);
        k.set_wake(ids[1], -3_000);
        k.set_wake(ids[2], -1);
        k.set_wake(ids[3], 0);
        assert_eq!(k.next_due(), Some(-3_000));
        let mut due = Vec::new();
        k.pop_due(-1, &mut due);
        due.sort();
        assert_eq!(due, vec![ids[1], ids[2]]);
        due.clear();
        k.pop_due(i64::MAX - 1, &mut due);
        assert_eq!(due, vec![ids[3]]);
        assert_eq!(k.next_due(), Some(i64::MAX));
    }

    /// Keys waiting for the end of input stay out of the calendar, and a bucket's earliest time
    /// is cached: neither is rescanned while the key holding the minimum stays.
    #[test]
    fn parked_keys_and_bucket_minimum_are_not_rescanned() {
        let mut k: Keys<()> = Keys::default();
        let ids: Vec<Id> = (0..10_000).map(|i| k.intern(0, &key(i)).unwrap()).collect();
        for &id in &ids {
            k.set_wake(id, AT_END);
        }
        assert!(k.buckets.is_empty(), "AT_END keys are not filed in a bucket");
        assert_eq!(k.next_due(), Some(AT_END));
        for (i, &id) in ids.iter().enumerate().take(100) {
            k.set_wake(id, 5_000 + i as i64);
        }
        assert_eq!(k.next_due(), Some(5_000));
        let b = &k.buckets[&(5_000 >> SHIFT)];
        assert!(b.min == 5_000 && b.holder == ids[0]);
        // Moving other keys within the bucket or out of it keeps the cached minimum.
        k.set_wake(ids[50], 5_010);
        k.discard_wake(ids[60]);
        let mut due = Vec::new();
        k.pop_due(4_999, &mut due);
        assert!(due.is_empty());
        assert_eq!(k.buckets[&(5_000 >> SHIFT)].ids.len(), 100, "the bucket was not rescanned");
        assert_eq!(k.next_due(), Some(5_000));
        assert_eq!(k.buckets[&(5_000 >> SHIFT)].ids.len(), 100, "the bucket was not rescanned");
        // The holder leaving: the minimum is recomputed (and the stale entry dropped).
        k.set_wake(ids[0], AT_END);
        assert_eq!(k.next_due(), Some(5_001));
        assert_eq!(k.buckets[&(5_000 >> SHIFT)].ids.len(), 98);
        k.set_wake(ids[1], 5_900);
        assert_eq!(k.next_due(), Some(5_002), "the holder moving later in its bucket");
        k.pop_due(6_000, &mut due);
        assert_eq!(due.len(), 98);
        assert_eq!(k.next_due(), Some(AT_END));
        assert_eq!(k.waiting(), 10_000 - 99);
    }

    /// Released keys give their slots back: the lowest free id is reused first, free slots at
    /// the tail are cut off, and the wake index is rebuilt from its entries (stale entries of
    /// ids past the slab's end are dropped, not followed).
    #[test]
    fn slab_shrinks_and_reuses_the_lowest_free_id() {
        let mut k: Keys<()> = Keys::default();
        let ids: Vec<Id> = (0..50_000).map(|i| k.intern(0, &key(i)).unwrap()).collect();
        for (i, &id) in ids.iter().enumerate() {
            k.set_wake(id, i as i64);
        }
        for &id in &ids[10..] {
            k.release(id);
        }
        assert_eq!(k.slots.len(), 10, "free slots at the tail are cut off");
        assert!(k.free.is_empty());
        k.release(ids[3]);
        k.release(ids[5]);
        assert_eq!(k.intern(0, &key(100_000)).unwrap(), ids[3], "the lowest free id first");
        assert_eq!(k.intern(0, &key(100_001)).unwrap(), ids[5]);
        assert_eq!(k.intern(0, &key(100_002)).unwrap(), 10);
        // Stale entries (of released ids, some past the end) are skipped and rebuilt away.
        for round in 0..1_000i64 {
            for (j, &id) in ids[..10].iter().enumerate() {
                if j != 3 && j != 5 {
                    k.set_wake(id, 2_000 * (round % 7) + j as i64);
                }
            }
        }
        assert!(k.entries <= 2 * k.waiting + 64);
        assert_eq!(k.waiting(), 8);
        let mut due = Vec::new();
        k.pop_due(AT_END, &mut due);
        due.sort_unstable();
        let mut want: Vec<Id> = ids[..10].to_vec();
        want.retain(|&id| id != ids[3] && id != ids[5]);
        assert_eq!(due, want);
        assert_eq!(k.next_due(), None);
    }

    /// The free-id bitmap against a `BTreeSet` (what it replaced): the same lowest id first,
    /// through words and summary words emptied and filled again below and above `lo`.
    #[test]
    fn free_ids_agree_with_a_btreeset() {
        let mut rng = Lcg(11);
        let mut f = FreeIds::default();
        let mut model = std::collections::BTreeSet::new();
        for step in 0..200_000 {
            let id = rng.next(if step % 2 == 0 { 300 } else { 9_000 }) as Id;
            match rng.next(4) {
                0 | 1 => {
                    f.insert(id);
                    model.insert(id);
                }
                2 => {
                    f.remove(id);
                    model.remove(&id);
                }
                _ => assert_eq!(f.pop_first(), model.pop_first(), "step {step}"),
            }
            assert_eq!(f.contains(id), model.contains(&id), "step {step}");
            assert_eq!(f.n, model.len(), "step {step}");
        }
        while let Some(id) = model.pop_first() {
            assert_eq!(f.pop_first(), Some(id));
        }
        assert!(f.is_empty() && f.pop_first().is_none());
    }
}
