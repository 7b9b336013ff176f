//! The decoded-keys budget of an `EngineState` that follows what it observes (session 24,
//! live24; docs/spark-runtime.md, "An adaptive decoded-keys budget (session 24, live24)").
//!
//! A state keeps up to `cap` bytes of keys decoded between exports (`keep_decoded`). That pays
//! when the keys come back while still decoded (a decode saved) and costs when they do not
//! (each is dropped later, out of the caches, and widens the working set). With `adaptive` the
//! state runs in one of two modes, the whole `cap` or none, and counts per export:
//! - with `cap`: keys reached while kept decoded (`useful`) against kept keys evicted without
//!   being reached since their last change (`wasted`);
//! - with none: each evicted key's position in the stream of evicted bytes (a ghost list);
//!   a key decoded again within `cap` evicted bytes of its eviction would have been kept by
//!   `cap` (`useful`), every other eviction would have been kept and then dropped (`wasted`).
//!
//! Both sums decay per export; once they hold enough keys the mode is `cap` when at least
//! `KEEP_IF` of them are useful, else none.

use std::collections::VecDeque;

use crate::keys::Id;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The share of useful keys from which keeping `cap` decoded is chosen. Measured: a useful
/// share of ~1/2 (the live ceiling's input: a card is reached at its event and at its release
/// ~6 calls later, then not for ~14 calls) is cheaper with none kept, ~1 (cards within two
/// calls) much dearer (session 23, live23).
const KEEP_IF: f64 = 0.75;
/// Each export's counts weigh this much of the sums (a window of a few calls).
const DECAY: f64 = 0.75;
/// Keys counted (decayed) before a decision: fewer keep the mode as it is.
const MIN_KEYS: f64 = 256.0;
/// With none kept, the ghost list follows the keys whose id is a multiple of this (a sample:
/// an insert and a queue push for every eviction were a few percent of the export).
const SAMPLE: Id = 8;

#[derive(Default)]
pub(crate) struct Budget {
    /// Follow the observations (else the budget is always `cap`).
    pub adaptive: bool,
    /// The most bytes of keys kept decoded after an export (`keep_decoded`).
    pub cap: usize,
    /// None kept (adaptive only): the ghost list records evictions.
    none: bool,
    useful: f64,
    wasted: f64,
    /// This export's counts (since the last one).
    hits: u64,
    cold: u64,
    ghost_hits: u64,
    evicted: u64,
    /// Of them, those in the ghost list's sample.
    sampled: u64,
    /// Bytes evicted so far in mode none, and each evicted key's position in them (the queue in
    /// eviction order, to forget entries more than `cap` behind).
    evicted_bytes: u64,
    ghost: HashMap<Id, u64>,
    ghost_q: VecDeque<(Id, u64)>,
    /// Totals since the state was made (`EngineState.budget_stats`).
    pub totals: [u64; 4],
}

impl Budget {
    pub fn new(cap: usize, adaptive: bool) -> Self {
        Self { adaptive, cap, ..Self::default() }
    }

    /// The budget of the export under way.
    pub fn keep(&self) -> usize {
        if self.none { 0 } else { self.cap }
    }

    /// A key reached that was kept decoded since an earlier export.
    pub fn hit(&mut self) {
        self.hits += 1;
    }

    /// A key reached that was held as bytes (decoded now).
    pub fn decoded(&mut self, id: Id) {
        if id % SAMPLE != 0 || self.ghost.is_empty() {
            return;
        }
        if let Some(at) = self.ghost.remove(&id) {
            if self.evicted_bytes - at <= self.cap as u64 {
                self.ghost_hits += 1;
            }
        }
    }

    /// A key's bytes replaced from elsewhere (an import): its ghost entry no longer says
    /// anything about this state's budget.
    pub fn replaced(&mut self, id: Id) {
        if id % SAMPLE == 0 && !self.ghost.is_empty() {
            self.ghost.remove(&id);
        }
    }

    /// A decoded key evicted by an export (`changed`: in this export's call).
    pub fn evicted(&mut self, id: Id, bytes: usize, changed: bool) {
        if !changed {
            self.cold += 1;
        }
        if self.none {
            self.evicted_bytes += bytes as u64;
        }
        self.evicted += 1;
        if id % SAMPLE != 0 {
            return;
        }
        self.sampled += 1;
        if self.none {
            self.ghost.insert(id, self.evicted_bytes);
            self.ghost_q.push_back((id, self.evicted_bytes));
        }
    }

    /// At an export, before its eviction: this call's counts into the sums, the mode decided.
    pub fn decide(&mut self) {
        // The previous export's evictions, with what has come back since.
        // (With none kept, counted over the sample: its share.)
        let (useful, wasted) = if self.none {
            let n = u64::from(SAMPLE);
            (n * self.ghost_hits, n * self.sampled.saturating_sub(self.ghost_hits))
        } else {
            (self.hits, self.cold)
        };
        for (t, n) in self.totals.iter_mut().zip([self.hits, self.ghost_hits, self.cold, self.evicted]) {
            *t += n;
        }
        (self.hits, self.ghost_hits, self.cold, self.evicted, self.sampled) = (0, 0, 0, 0, 0);
        self.useful = self.useful * DECAY + useful as f64;
        self.wasted = self.wasted * DECAY + wasted as f64;
        while let Some(&(id, at)) = self.ghost_q.front() {
            if self.evicted_bytes - at <= self.cap as u64 {
                break;
            }
            self.ghost_q.pop_front();
            if self.ghost.get(&id) == Some(&at) {
                self.ghost.remove(&id);
            }
        }
        if !self.adaptive || self.useful + self.wasted < MIN_KEYS {
            return;
        }
        let none = self.useful < KEEP_IF * (self.useful + self.wasted);
        if none != self.none {
            // A new mode's counts start afresh (the other mode's measure another thing).
            (self.none, self.useful, self.wasted) = (none, 0.0, 0.0);
            if !none {
                self.ghost.clear();
                self.ghost_q.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `cap`: keys found kept (useful) against kept keys evicted unreached (wasted); with
    /// none: evictions decoded again within `cap` evicted bytes (useful) or not.
    #[test]
    fn follows_the_useful_share() {
        let mut b = Budget::new(1000, true);
        assert_eq!(b.keep(), 1000);
        // Half the kept keys come back, half are evicted cold: none kept.
        for _ in 0..4 {
            (0..200).for_each(|_| b.hit());
            (0..200).for_each(|i| b.evicted(i, 10, false));
            b.decide();
        }
        assert_eq!(b.keep(), 0);
        // Every eviction comes back within `cap` bytes: keep `cap` again.
        let mut next = 0;
        for _ in 0..4 {
            let ids: Vec<Id> = (next..next + 200).map(|i| i * SAMPLE).collect();
            next += 200;
            ids.iter().for_each(|&i| b.evicted(i, 4, true));
            b.decide();
            ids.iter().for_each(|&i| b.decoded(i));
        }
        b.decide();
        assert_eq!(b.keep(), 1000);
        // Not adaptive: always `cap`.
        let mut f = Budget::new(1000, false);
        (0..1000).for_each(|i| f.evicted(i, 10, false));
        f.decide();
        assert_eq!(f.keep(), 1000);
    }

    /// A key decoded again more than `cap` evicted bytes after its eviction is not a ghost hit,
    /// and the ghost list forgets it.
    #[test]
    fn ghosts_older_than_the_cap_are_forgotten() {
        let mut b = Budget::new(100, true);
        b.none = true;
        // 40 keys of the sample, 10 bytes each, then 8 out of it: 3 within 100 bytes of the end.
        (0..40).for_each(|i| b.evicted(i * SAMPLE, 10, true));
        (0..SAMPLE).for_each(|i| b.evicted(i * SAMPLE + 1, 10, true)); // out of the sample: bytes only
        b.decide();
        assert_eq!(b.ghost.len(), 3);
        (0..40).for_each(|i| b.decoded(i * SAMPLE));
        assert_eq!((b.ghost_hits, b.sampled), (3, 0)); // (the counts went into the sums)
        assert!(b.ghost.is_empty());
    }
}
