//! A group's key table (`keys.rs`): key ids by their text's 32-bit hash, the text itself
//! compared in the key's slot (docs/native-core.md, "Many keys: the key table and the mass
//! expiry"). Also arrow.rs's string interning: indexes into its strings, by the same hash.

use std::hash::BuildHasher;

use crate::keys::Id;

/// The 32-bit hash of a text's bytes (both halves of the 64-bit hash folded): a `Table`'s
/// entries keep it.
pub fn hash32(hasher: &foldhash::fast::RandomState, b: &[u8]) -> u32 {
    let h = hasher.hash_one(b);
    (h ^ (h >> 32)) as u32
}

/// An entry of a group's key table: the key's id and 32 bits of its text's hash (the text is
/// compared in the key's slot; a table grows by these bits, without reading the slots).
#[derive(Clone, Copy)]
pub struct Named {
    pub id: Id,
    pub h: u32,
}

/// `Named::id` of an empty place in a `Table` (never a key's id: `intern` stops below it).
pub const VACANT: Id = Id::MAX;

/// A group's key table: open addressing with linear probing over 8-byte entries, the key's
/// place at its hash's low bits. A lookup reads one line of entries (hashbrown's table read a
/// control group and then the entry, two misses a key with 1M keys), compares the full 32 bits
/// of the hash there and the text in the slot; its line can be asked for ahead (`line`). A
/// removal shifts the entries after it back (no tombstones). At most 5/8 full.
#[derive(Default)]
pub struct Table {
    pub e: Vec<Named>,
    pub len: usize,
}

impl Table {
    fn mask(&self) -> usize {
        self.e.len().wrapping_sub(1)
    }

    /// Where a key of hash `h` is looked for first (any address while the table is empty: only
    /// a prefetch reads it).
    pub fn line(&self, h: u32) -> *const Named {
        self.e.as_ptr().wrapping_add(h as usize & self.mask())
    }

    /// The place of the entry of hash `h` for which `eq(id)` holds.
    pub fn find(&self, h: u32, mut eq: impl FnMut(Id) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let m = self.mask();
        let mut i = h as usize & m;
        loop {
            let e = self.e[i];
            if e.id == VACANT {
                return None;
            }
            if e.h == h && eq(e.id) {
                return Some(i);
            }
            i = (i + 1) & m;
        }
    }

    /// The id of the entry of hash `h` for which `eq(id)` holds (`find`'s entry).
    pub fn get(&self, h: u32, eq: impl FnMut(Id) -> bool) -> Option<Id> {
        self.find(h, eq).map(|i| self.e[i].id)
    }

    pub fn insert(&mut self, n: Named) {
        if (self.len + 1) * 8 > self.e.len() * 5 {
            self.resize((self.e.len() * 2).max(16));
        }
        self.put(n);
        self.len += 1;
    }

    fn put(&mut self, n: Named) {
        let m = self.mask();
        let mut i = n.h as usize & m;
        while self.e[i].id != VACANT {
            i = (i + 1) & m;
        }
        self.e[i] = n;
    }

    /// Empty place `i`, moving back the entries of its run that may take it.
    pub fn remove_at(&mut self, mut i: usize) {
        let m = self.mask();
        let mut j = i;
        loop {
            j = (j + 1) & m;
            let e = self.e[j];
            if e.id == VACANT {
                break;
            }
            // `e` may move to `i` unless its home lies cyclically in (i, j].
            let home = e.h as usize & m;
            if (j.wrapping_sub(home) & m) >= (j.wrapping_sub(i) & m) {
                self.e[i] = e;
                i = j;
            }
        }
        self.e[i] = Named { id: VACANT, h: 0 };
        self.len -= 1;
        if self.e.len() > 64 && self.len * 16 < self.e.len() {
            self.resize((self.len * 4).next_power_of_two().max(16));
        }
    }

    fn resize(&mut self, cap: usize) {
        let old = std::mem::replace(&mut self.e, vec![Named { id: VACANT, h: 0 }; cap]);
        for n in old.into_iter().filter(|n| n.id != VACANT) {
            self.put(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::tests::Lcg;

    /// The table alone, with hashes of a few bits (long runs that wrap around the end): every
    /// entry is found at its place through growth, removals that shift runs back, and
    /// shrinking, against a map.
    #[test]
    fn table_agrees_with_a_map_through_runs_that_wrap() {
        let mut rng = Lcg(3);
        let mut t = Table::default();
        let mut model: std::collections::HashMap<Id, u32> = Default::default();
        let mut removed = Vec::new();
        for step in 0..200_000u32 {
            // Grow to ~5,000 entries, then empty the table (shrinking it) and grow it again.
            let filling = (step / 20_000) % 2 == 0;
            let id = rng.next(6_000) as Id;
            if rng.next(3) != 0 && filling {
                if let std::collections::hash_map::Entry::Vacant(v) = model.entry(id) {
                    let h = if rng.next(2) == 0 { rng.next(16) as u32 } else { u32::MAX - rng.next(16) as u32 };
                    t.insert(Named { id, h });
                    v.insert(h);
                }
            } else if let Some(h) = model.remove(&id) {
                let i = t.find(h, |e| e == id).expect("a live entry is found");
                t.remove_at(i);
                // A removed entry is not found.
                assert!(t.find(h, |e| e == id).is_none(), "step {step}");
                removed.push((id, h));
            }
            if step % 997 == 0 {
                for (&id, &h) in &model {
                    let i = t.find(h, |e| e == id).expect("found");
                    assert_eq!((t.e[i].id, t.e[i].h), (id, h), "step {step}");
                }
                // Entries removed since the last check (some inserted again since, maybe under
                // another hash) are found exactly as the map has them.
                for (id, h) in removed.drain(..) {
                    assert_eq!(t.find(h, |e| e == id).is_some(), model.get(&id) == Some(&h), "step {step}");
                }
                assert_eq!(t.len, model.len());
                assert_eq!(t.e.iter().filter(|n| n.id != VACANT).count(), model.len());
                assert!(t.e.is_empty() || t.len * 8 <= t.e.len() * 5);
            }
        }
        assert!(t.e.len() <= 64 || t.len * 16 >= t.e.len(), "an emptied table shrinks");
    }
}
