//! A key's state as bytes, format version 4 (`CEPNK` v4; versions 1-3 fail with a message
//! that says to discard or replay the state).
//!
//! One event table per key, shared by every rule's partial matches and the key's buffer; a rule
//! named by a 32-bit fingerprint of its id and version (FNV-1a); event times and sequence
//! numbers as deltas from the previous event's. What v4 adds to v3 (docs/native-core.md, "Key
//! state format version 4"):
//!
//! - a column table equal to a **known table** (a declared stream's fields, in order: `Known`,
//!   given to the engine with its rules, or carried by the `CEPNB` blob the key came in) is
//!   written as its 4-byte fingerprint, not as its names (~36 B per fraud key in v3);
//! - **compact captures**: a partial match's captures that continue the previous one (same
//!   variable, next row, next event of the table) are counted, not written; a capture list
//!   equal to the previous list of the part without its first m captures (the overlapping runs
//!   of `A{5}`: each run holds the next run's captures and one more) is one varint, and one that
//!   extends a prefix of it writes only the new captures;
//! - a run with one entry (the usual case) packs the entry's position into its flag byte;
//! - a deadline a whole number of seconds after the part's first event is written in seconds;
//! - a row's table and kind share one varint; a string already written in the key is one byte
//!   (tags 16-255) for the first 240 such strings.
//!
//! Layout (integers are LEB128 varints, `iv` signed/zigzag, `uv` unsigned):
//! ```text
//! "CEPNK" u16le 4
//! uv nparts, per part: u32le fingerprint, iv row, uv nruns, per run:
//!     iv (row - start), u8 h (bit 0 matched, bit 1 has tpart, h >> 2: 0 = uv nentries and per
//!     entry uv (pos + 1) then caps follow; k >= 1 = one entry at pos = k - 2),
//!     [tpart caps], the entries' caps;
//!   then u8 deadline kind (0 none, 1 iv ms, 2 iv s) after the time of the part's first event
//!   caps: uv h; h & 3 = 0: h >> 2 captures written; 1: the previous caps of the part without
//!     its first h >> 2; 2: the first h >> 2 of the previous caps, then uv n captures written.
//!     Written captures go in segments: uv (c << 3 | min(var, 7)), [uv var - 7], iv (row -
//!     previous row; the first from the run start), iv (event index - previous index - 1),
//!     then c more captures each continuing the last (same var, row + 1, event index + 1)
//! column tables: uv n, per table uv h: 0 = u32le fingerprint of a known table; n + 1 = n names
//!   (uv length + UTF-8)
//! events: uv n, per event: iv (ts - previous ts), uv kind: 0 Python (uv index of its (data,
//!   seq) in the tail), t + 1 row of table t (iv seq - previous row seq, one value per column)
//!   value tags: 0 null, 1 false, 2 true, 3 int iv, 4 f64le, 5 str (uv len + UTF-8),
//!   6 Python (uv tail index), 7 int = the event's time, 8 str = the key,
//!   9 float = iv n / 100 (exact), 10 str = the n-th string written before (uv n),
//!   16 + n: the n-th string written before (n < 240)
//! buffer: uv n, per buffered event its uv event index
//! tail: uv n, then (when not 0) the list of Python objects pickled
//! ```

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::evcodec::{put_iv, put_str, put_uv, Dec};
use crate::expr::{Cap, CapVec, Caps, Cols, Ev, Row, RowRef};
use crate::matcher::{Entry, MState, Run};
use crate::value::Value;

pub const VERSION: u16 = 4;

/// foldhash, as the engine's maps: the encoder's per-key maps are small and short-lived.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

fn fnv(h: &mut u32, bytes: &[u8]) {
    for &b in bytes {
        *h ^= u32::from(b);
        *h = h.wrapping_mul(0x0100_0193);
    }
}

/// FNV-1a (32 bits) of a rule's id and version: how a key state names a rule's part.
pub fn fingerprint(rule: &str, version: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    fnv(&mut h, rule.as_bytes());
    fnv(&mut h, &[0xff]);
    fnv(&mut h, version.as_bytes());
    h
}

/// FNV-1a (32 bits) of a column table's names: how a key state names a known table.
pub fn table_fingerprint(names: &[String]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for n in names {
        fnv(&mut h, n.as_bytes());
        fnv(&mut h, &[0xff]);
    }
    h
}

/// Column tables a key state may name by fingerprint instead of writing their names.
#[derive(Default)]
pub struct Known {
    by_fp: HashMap<u32, Arc<Cols>>,
}

impl Known {
    /// Add a table (one already known by its fingerprint, or colliding with one, is kept).
    pub fn add(&mut self, py: Python<'_>, names: Vec<String>) {
        let fp = table_fingerprint(&names);
        self.by_fp.entry(fp).or_insert_with(|| {
            Arc::new(Cols { py_names: names.iter().map(|n| PyString::intern(py, n).unbind()).collect(), names })
        });
    }

    /// The fingerprint of `cols` when it is a known table.
    pub fn fp_of(&self, cols: &Arc<Cols>) -> Option<u32> {
        if let Some((fp, _)) = self.by_fp.iter().find(|(_, t)| Arc::ptr_eq(t, cols)) {
            return Some(*fp);
        }
        let fp = table_fingerprint(&cols.names);
        self.by_fp.get(&fp).filter(|t| t.names == cols.names).map(|_| fp)
    }

    pub fn get(&self, fp: u32) -> Option<&Arc<Cols>> {
        self.by_fp.get(&fp)
    }

    /// The tables, ordered by fingerprint.
    pub fn tables(&self) -> Vec<&Arc<Cols>> {
        let mut v: Vec<(&u32, &Arc<Cols>)> = self.by_fp.iter().collect();
        v.sort_by_key(|(fp, _)| **fp);
        v.into_iter().map(|(_, t)| t).collect()
    }
}

/// A map for the encoder's per-key lookups: a key holds a few events, tables and strings, so
/// a linear scan of a vector, without hashing or a table's allocation, up to 16 entries.
struct Small<K, V> {
    v: Vec<(K, V)>,
    map: Option<HashMap<K, V>>,
}

impl<K: std::hash::Hash + Eq + Copy, V: Copy> Small<K, V> {
    fn new() -> Self {
        Small { v: Vec::new(), map: None }
    }

    fn get(&self, k: &K) -> Option<V> {
        match &self.map {
            Some(m) => m.get(k).copied(),
            None => self.v.iter().find(|(x, _)| x == k).map(|(_, v)| *v),
        }
    }

    fn insert(&mut self, k: K, v: V) {
        match &mut self.map {
            Some(m) => {
                m.insert(k, v);
            }
            None if self.v.len() < 16 => self.v.push((k, v)),
            None => {
                let mut m: HashMap<K, V> = self.v.drain(..).collect();
                m.insert(k, v);
                self.map = Some(m);
            }
        }
    }

    fn len(&self) -> usize {
        self.map.as_ref().map_or(self.v.len(), HashMap::len)
    }
}

/// One event of the key's table as the encoder sees it.
pub enum Src<'a> {
    /// `id`: the block holding the row (its `Ev`, or a JSON event's `Row`), one entry of the
    /// table however many captures and buffers hold it.
    Row { row: RowRef<'a>, id: usize, seq: i64, ts: i64 },
    Py { data: Py<PyAny>, seq: Py<PyAny>, ts: i64 },
}

#[derive(Hash, PartialEq, Eq, Clone, Copy)]
enum Id {
    Row(usize, i64, i64),
    Py(usize, usize, i64),
}

/// A capture as written: (variable, row, event index).
type RawCap = (u32, i64, u32);
type RawCaps = Vec<RawCap>;

pub struct KeyEnc<'k, 'a> {
    key: &'k str,
    known: [&'k Known; 2],
    parts: Vec<u8>,
    index: Small<Id, u32>,
    events: Vec<Src<'a>>,
    /// The part's last capture list (what the next one may refer to).
    prev: RawCaps,
}

/// What a decoded key gives back: per part (fingerprint, state), the buffer as event indexes,
/// and the events.
pub struct Decoded {
    pub parts: Vec<(u32, MState)>,
    pub buffer: Vec<usize>,
    pub events: Vec<Arc<DEv>>,
}

/// A decoded event: a row (its one `Ev`, shared by every part and the buffer that hold it, as
/// when live: the rules of a key's group read rows by one field table, projected on first
/// read), or Python objects, with their time (each part builds its own `Ev` on them).
pub enum DEv {
    Row(Ev),
    Py { data: Py<PyAny>, seq: Py<PyAny>, ts: i64 },
}

impl DEv {
    pub fn ts(&self) -> i64 {
        match self {
            DEv::Row(ev) => ev.ts,
            DEv::Py { ts, .. } => *ts,
        }
    }

    pub fn to_ev(&self, py: Python<'_>) -> Ev {
        match self {
            DEv::Row(ev) => ev.clone(),
            DEv::Py { data, seq, ts } => Ev::from_py(data.clone_ref(py), seq.clone_ref(py), *ts),
        }
    }
}

/// Captures written in segments (`caps` in the layout), after a capture at (`row`, `idx`).
fn put_caps(out: &mut Vec<u8>, caps: &[RawCap], mut row: i64, mut idx: i64) {
    let mut k = 0;
    while k < caps.len() {
        let (var, r, i) = caps[k];
        let mut c = 0;
        while k + c + 1 < caps.len() && caps[k + c + 1] == (var, caps[k + c].1 + 1, caps[k + c].2 + 1) {
            c += 1;
        }
        put_uv(out, ((c as u64) << 3) | u64::from(var.min(7)));
        if var >= 7 {
            put_uv(out, u64::from(var - 7));
        }
        put_iv(out, r.wrapping_sub(row));
        put_iv(out, i64::from(i) - idx - 1);
        row = caps[k + c].1;
        idx = i64::from(caps[k + c].2);
        k += c + 1;
    }
}

/// A capture list (`caps` in the layout): a suffix of the part's previous list, a prefix of it
/// extended, or written out.
fn put_cap_list(out: &mut Vec<u8>, cur: &[RawCap], prev: &[RawCap], start: i64) {
    if !cur.is_empty() && cur.len() <= prev.len() && prev[prev.len() - cur.len()..] == cur[..] {
        put_uv(out, (((prev.len() - cur.len()) as u64) << 2) | 1);
        return;
    }
    let p = prev.iter().zip(cur).take_while(|(a, b)| a == b).count();
    if p > 0 {
        put_uv(out, ((p as u64) << 2) | 2);
        put_uv(out, (cur.len() - p) as u64);
        put_caps(out, &cur[p..], cur[p - 1].1, i64::from(cur[p - 1].2));
    } else {
        put_uv(out, (cur.len() as u64) << 2);
        put_caps(out, cur, start, -1);
    }
}

impl<'k, 'a> KeyEnc<'k, 'a> {
    /// `known`: the tables written by fingerprint (the engine's, and those of blobs read).
    pub fn new(key: &'k str, known: [&'k Known; 2]) -> Self {
        KeyEnc { key, known, parts: Vec::with_capacity(64), index: Small::new(), events: Vec::new(), prev: Vec::new() }
    }

    /// The index of an event in the key's table (added when new).
    pub fn event(&mut self, src: Src<'a>) -> u32 {
        let id = match &src {
            Src::Row { id, seq, ts, .. } => Id::Row(*id, *seq, *ts),
            Src::Py { data, seq, ts } => Id::Py(data.as_ptr() as usize, seq.as_ptr() as usize, *ts),
        };
        if let Some(i) = self.index.get(&id) {
            return i;
        }
        let i = self.events.len() as u32;
        self.index.insert(id, i);
        self.events.push(src);
        i
    }

    fn ev_src(py: Python<'_>, ev: &'a Ev) -> PyResult<Src<'a>> {
        Ok(match ev.row() {
            Some(row) => Src::Row { row, id: ev.as_ptr() as usize, seq: ev.seqi, ts: ev.ts },
            None => Src::Py { data: ev.obj(py)?.clone_ref(py), seq: ev.seq_obj(py)?.clone_ref(py), ts: ev.ts },
        })
    }

    fn caps(&mut self, py: Python<'_>, caps: &'a [Cap], start: i64, first_ts: &mut Option<i64>) -> PyResult<()> {
        let mut cur: RawCaps = Vec::with_capacity(caps.len());
        for c in caps {
            let src = Self::ev_src(py, &c.ev)?;
            if first_ts.is_none() {
                *first_ts = Some(c.ev.ts);
            }
            cur.push((c.var, c.row, self.event(src)));
        }
        put_cap_list(&mut self.parts, &cur, &self.prev, start);
        self.prev = cur;
        Ok(())
    }

    /// One rule's part.
    pub fn part(&mut self, py: Python<'_>, fp: u32, s: &'a MState) -> PyResult<()> {
        self.parts.extend_from_slice(&fp.to_le_bytes());
        put_iv(&mut self.parts, s.row);
        put_uv(&mut self.parts, s.runs.len() as u64);
        self.prev.clear();
        let mut first_ts = None;
        for r in &s.runs {
            put_iv(&mut self.parts, s.row.wrapping_sub(r.start));
            let one = match r.entries.as_slice() {
                [e] if (-1..62).contains(&e.pos) => (e.pos + 2) as u8,
                _ => 0,
            };
            self.parts.push(u8::from(r.matched) | (u8::from(r.tpart.is_some()) << 1) | (one << 2));
            if let Some(t) = &r.tpart {
                self.caps(py, t, r.start, &mut first_ts)?;
            }
            if one == 0 {
                put_uv(&mut self.parts, r.entries.len() as u64);
            }
            for e in &r.entries {
                if one == 0 {
                    put_uv(&mut self.parts, (i64::from(e.pos) + 1) as u64);
                }
                self.caps(py, &e.caps, r.start, &mut first_ts)?;
            }
        }
        match s.deadline {
            None => self.parts.push(0),
            Some(d) => {
                let x = d.wrapping_sub(first_ts.unwrap_or(0));
                if x % 1000 == 0 {
                    self.parts.push(2);
                    put_iv(&mut self.parts, x / 1000);
                } else {
                    self.parts.push(1);
                    put_iv(&mut self.parts, x);
                }
            }
        }
        Ok(())
    }

    /// The whole key: `nparts` parts written, then the buffer's events (indexes in the table).
    pub fn finish(mut self, py: Python<'_>, nparts: usize, buffer: Vec<Src<'a>>) -> PyResult<Vec<u8>> {
        let buf_idx: Vec<u32> = buffer.into_iter().map(|s| self.event(s)).collect();
        let mut out = Vec::with_capacity(self.parts.len() + 32 + 16 * self.events.len());
        out.extend_from_slice(crate::engine::KEY_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        put_uv(&mut out, nparts as u64);
        out.extend_from_slice(&self.parts);
        // Column tables, by content: a known one by its fingerprint.
        let mut tables: Vec<&Arc<Cols>> = Vec::new();
        let mut table_of: Small<usize, u32> = Small::new();
        for e in &self.events {
            if let Src::Row { row, .. } = e {
                let p = Arc::as_ptr(row.cols) as usize;
                if table_of.get(&p).is_some() {
                    continue;
                }
                let t = match tables.iter().position(|t| t.names == row.cols.names) {
                    Some(t) => t as u32,
                    None => {
                        tables.push(row.cols);
                        (tables.len() - 1) as u32
                    }
                };
                table_of.insert(p, t);
            }
        }
        put_uv(&mut out, tables.len() as u64);
        for t in &tables {
            match self.known.iter().find_map(|k| k.fp_of(t)) {
                Some(fp) => {
                    out.push(0);
                    out.extend_from_slice(&fp.to_le_bytes());
                }
                None => {
                    put_uv(&mut out, t.names.len() as u64 + 1);
                    for n in &t.names {
                        put_str(&mut out, n);
                    }
                }
            }
        }
        put_uv(&mut out, self.events.len() as u64);
        let mut tail: Vec<Py<PyAny>> = Vec::new();
        let mut strings: Small<&str, u32> = Small::new();
        let (mut pts, mut pseq) = (0i64, 0i64);
        for e in &self.events {
            match e {
                Src::Py { data, seq, ts } => {
                    put_iv(&mut out, ts.wrapping_sub(pts));
                    pts = *ts;
                    out.push(0);
                    put_uv(&mut out, tail.len() as u64);
                    tail.push(data.clone_ref(py));
                    tail.push(seq.clone_ref(py));
                }
                Src::Row { row, seq, ts, .. } => {
                    put_iv(&mut out, ts.wrapping_sub(pts));
                    pts = *ts;
                    put_uv(&mut out, u64::from(table_of.get(&(Arc::as_ptr(row.cols) as usize)).unwrap_or(0)) + 1);
                    put_iv(&mut out, seq.wrapping_sub(pseq));
                    pseq = *seq;
                    for v in row.vals {
                        put_value(py, &mut out, v, *ts, self.key, &mut strings, &mut tail);
                    }
                }
            }
        }
        put_uv(&mut out, buf_idx.len() as u64);
        for i in buf_idx {
            put_uv(&mut out, u64::from(i));
        }
        put_uv(&mut out, tail.len() as u64);
        if !tail.is_empty() {
            let list = PyList::new(py, tail)?;
            let pickled = py.import("pickle")?.getattr("dumps")?.call1((list, 5))?;
            out.extend_from_slice(pickled.downcast::<PyBytes>()?.as_bytes());
        }
        Ok(out)
    }
}

fn put_value<'s>(
    py: Python<'_>,
    out: &mut Vec<u8>,
    v: &'s Value,
    ts: i64,
    key: &str,
    strings: &mut Small<&'s str, u32>,
    tail: &mut Vec<Py<PyAny>>,
) {
    match v {
        Value::Null => out.push(0),
        Value::Bool(false) => out.push(1),
        Value::Bool(true) => out.push(2),
        Value::Int(i) if *i == ts => out.push(7),
        Value::Int(i) => {
            out.push(3);
            put_iv(out, *i);
        }
        Value::Float(f) => {
            let n = (f * 100.0).round();
            if n.abs() < 9.0e15 && ((n as i64) as f64 / 100.0).to_bits() == f.to_bits() {
                out.push(9);
                put_iv(out, n as i64);
            } else {
                out.push(4);
                out.extend_from_slice(&f.to_le_bytes());
            }
        }
        Value::Str(s) if **s == *key => out.push(8),
        Value::Str(s) => match strings.get(&&**s) {
            Some(n) if n < 240 => out.push(16 + n as u8),
            Some(n) => {
                out.push(10);
                put_uv(out, u64::from(n));
            }
            None => {
                out.push(5);
                put_str(out, s);
                let n = strings.len() as u32;
                strings.insert(s, n);
            }
        },
        Value::Py(o) => {
            out.push(6);
            put_uv(out, tail.len() as u64);
            tail.push(o.clone_ref(py));
        }
    }
}

fn corrupt() -> PyErr {
    PyValueError::new_err("native engine key state: truncated or corrupt bytes")
}

struct RawRun {
    start: i64,
    matched: bool,
    tpart: Option<RawCaps>,
    entries: Vec<(i32, RawCaps)>,
}

/// `n` captures written in segments after a capture at (`row`, `idx`), appended to `v`.
fn read_caps(d: &mut Dec<'_>, n: usize, mut row: i64, mut idx: i64, v: &mut RawCaps) -> PyResult<()> {
    // A run captures each event at most once and every event takes at least a byte: a count
    // past the bytes' length is corrupt (and must not become a huge allocation).
    if n > d.data.len() {
        return Err(corrupt());
    }
    let end = v.len() + n;
    while v.len() < end {
        let h = d.uv()?;
        let mut var = u32::try_from(h & 7).map_err(|_| corrupt())?;
        if var == 7 {
            var = u32::try_from(d.uv()? + 7).map_err(|_| corrupt())?;
        }
        let more = usize::try_from(h >> 3).map_err(|_| corrupt())?;
        if more >= end - v.len() {
            return Err(corrupt());
        }
        row = row.wrapping_add(d.iv()?);
        idx = idx.wrapping_add(d.iv()?).wrapping_add(1);
        for k in 0..=more as i64 {
            let i = idx.checked_add(k).and_then(|x| u32::try_from(x).ok()).ok_or_else(corrupt)?;
            v.push((var, row.wrapping_add(k), i));
        }
        row = row.wrapping_add(more as i64);
        idx = idx.checked_add(more as i64).ok_or_else(corrupt)?;
    }
    Ok(())
}

fn raw_caps(d: &mut Dec<'_>, start: i64, prev: &mut RawCaps) -> PyResult<RawCaps> {
    let h = d.uv()?;
    let m = usize::try_from(h >> 2).map_err(|_| corrupt())?;
    let caps = match h & 3 {
        0 => {
            let mut v = Vec::with_capacity(m.min(1 << 12));
            read_caps(d, m, start, -1, &mut v)?;
            v
        }
        1 => prev.get(m..).filter(|s| !s.is_empty()).ok_or_else(corrupt)?.to_vec(),
        2 => {
            let mut v = prev.get(..m).filter(|s| !s.is_empty()).ok_or_else(corrupt)?.to_vec();
            let n = d.uv()? as usize;
            let (row, idx) = (v[m - 1].1, i64::from(v[m - 1].2));
            read_caps(d, n, row, idx, &mut v)?;
            v
        }
        _ => return Err(corrupt()),
    };
    prev.clone_from(&caps);
    Ok(caps)
}

fn val(d: &mut Dec<'_>, ts: i64, key: &Arc<str>, strings: &mut Vec<Arc<str>>, py_at: &mut Vec<usize>) -> PyResult<Value> {
    Ok(match d.u8()? {
        0 => Value::Null,
        1 => Value::Bool(false),
        2 => Value::Bool(true),
        3 => Value::Int(d.iv()?),
        4 => Value::Float(f64::from_le_bytes(d.take(8)?.try_into().map_err(|_| corrupt())?)),
        5 => {
            let n = d.uv()? as usize;
            let s: Arc<str> = Arc::from(std::str::from_utf8(d.take(n)?).map_err(|_| corrupt())?);
            strings.push(s.clone());
            Value::Str(s)
        }
        6 => {
            py_at.push(d.uv()? as usize);
            Value::Null
        }
        7 => Value::Int(ts),
        8 => Value::Str(key.clone()),
        9 => Value::Float(d.iv()? as f64 / 100.0),
        10 => Value::Str(strings.get(d.uv()? as usize).ok_or_else(corrupt)?.clone()),
        t @ 16..=255 => Value::Str(strings.get(usize::from(t - 16)).ok_or_else(corrupt)?.clone()),
        _ => return Err(corrupt()),
    })
}

/// Read `KeyEnc`'s bytes (the caller checked the magic and the version); `known`: the tables a
/// key may name by fingerprint.
pub fn decode(py: Python<'_>, data: &[u8], key: &str, known: [&Known; 2]) -> PyResult<Decoded> {
    // One `Arc` for the key's text, shared by every column value equal to it (tag 8).
    let key: Arc<str> = Arc::from(key);
    let mut d = Dec { data, at: 7, var: true };
    let nparts = d.uv()? as usize;
    let mut raw_parts = Vec::with_capacity(nparts.min(1 << 10));
    for _ in 0..nparts {
        let fp = u32::from_le_bytes(d.take(4)?.try_into().map_err(|_| corrupt())?);
        let row = d.iv()?;
        let nruns = d.uv()? as usize;
        let mut runs = Vec::with_capacity(nruns.min(1 << 12));
        let mut prev = Vec::new();
        for _ in 0..nruns {
            let start = row.wrapping_sub(d.iv()?);
            let flags = d.u8()?;
            let tpart = if flags & 2 != 0 { Some(raw_caps(&mut d, start, &mut prev)?) } else { None };
            let one = flags >> 2;
            let n = if one == 0 { d.uv()? as usize } else { 1 };
            let mut entries = Vec::with_capacity(n.min(1 << 12));
            for _ in 0..n {
                let pos = if one == 0 { d.uv()? as i64 - 1 } else { i64::from(one) - 2 };
                let pos = i32::try_from(pos).map_err(|_| corrupt())?;
                entries.push((pos, raw_caps(&mut d, start, &mut prev)?));
            }
            runs.push(RawRun { start, matched: flags & 1 != 0, tpart, entries });
        }
        let deadline = match d.u8()? {
            0 => None,
            1 => Some(d.iv()?),
            2 => Some(d.iv()?.wrapping_mul(1000)),
            _ => return Err(corrupt()),
        };
        raw_parts.push((fp, row, runs, deadline));
    }
    let ntables = d.uv()? as usize;
    let mut tables = Vec::with_capacity(ntables.min(1 << 10));
    for _ in 0..ntables {
        let n = d.uv()? as usize;
        if n == 0 {
            let fp = u32::from_le_bytes(d.take(4)?.try_into().map_err(|_| corrupt())?);
            let t = known.iter().find_map(|k| k.get(fp)).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "native engine key state: its events name column table {fp:08x}, which is \
                     neither a stream of these rules nor in the state read: the state was \
                     written for another declaration of the stream; discard it (reset the \
                     checkpoint) or replay the input"
                ))
            })?;
            tables.push(t.clone());
            continue;
        }
        let mut names = Vec::with_capacity((n - 1).min(1 << 12));
        for _ in 1..n {
            let len = d.uv()? as usize;
            names.push(std::str::from_utf8(d.take(len)?).map_err(|_| corrupt())?.to_owned());
        }
        tables.push(Arc::new(Cols { py_names: names.iter().map(|n| PyString::intern(py, n).unbind()).collect(), names }));
    }
    let nev = d.uv()? as usize;
    enum Slot {
        Py(i64, usize),
        Row(i64, i64, usize, Vec<Value>, Vec<(usize, usize)>),
    }
    let mut slots = Vec::with_capacity(nev.min(1 << 16));
    let mut strings: Vec<Arc<str>> = Vec::new();
    let (mut pts, mut pseq) = (0i64, 0i64);
    for _ in 0..nev {
        let ts = pts.wrapping_add(d.iv()?);
        pts = ts;
        match d.uv()? as usize {
            0 => slots.push(Slot::Py(ts, d.uv()? as usize)),
            t => {
                let t = t - 1;
                let seq = pseq.wrapping_add(d.iv()?);
                pseq = seq;
                let ncols = tables.get(t).ok_or_else(corrupt)?.names.len();
                let mut vals = Vec::with_capacity(ncols);
                let mut py_at = Vec::new();
                for c in 0..ncols {
                    let mut at = Vec::new();
                    vals.push(val(&mut d, ts, &key, &mut strings, &mut at)?);
                    py_at.extend(at.into_iter().map(|i| (c, i)));
                }
                slots.push(Slot::Row(ts, seq, t, vals, py_at));
            }
        }
    }
    let nbuf = d.uv()? as usize;
    let mut buffer = Vec::with_capacity(nbuf.min(1 << 16));
    for _ in 0..nbuf {
        let i = d.uv()? as usize;
        if i >= nev {
            return Err(corrupt());
        }
        buffer.push(i);
    }
    let ntail = d.uv()? as usize;
    let tail = if ntail == 0 {
        None
    } else {
        let rest = &d.data[d.at..];
        Some(py.import("pickle")?.getattr("loads")?.call1((PyBytes::new(py, rest),))?)
    };
    let get = |i: usize| -> PyResult<Py<PyAny>> {
        match &tail {
            Some(t) => Ok(t.get_item(i)?.unbind()),
            None => Err(corrupt()),
        }
    };
    let mut events = Vec::with_capacity(slots.len());
    for slot in slots {
        events.push(Arc::new(match slot {
            Slot::Py(ts, i) => DEv::Py { data: get(i)?, seq: get(i.checked_add(1).ok_or_else(corrupt)?)?, ts },
            Slot::Row(ts, seq, t, mut vals, py_at) => {
                for (c, i) in py_at {
                    vals[c] = Value::Py(Arc::new(get(i)?));
                }
                DEv::Row(Ev::from_row_lazy(Row { cols: tables[t].clone(), vals }, seq, ts))
            }
        }));
    }
    let mut parts = Vec::with_capacity(raw_parts.len());
    for (fp, row, runs, deadline) in raw_parts {
        // A row event's one `Ev` (`DEv::Row`); a Python-object event's, one per part.
        let mut evs: HashMap<u32, Ev> = HashMap::default();
        let mut first_ts = None;
        let mut caps = |r: &RawCaps| -> PyResult<Caps> {
            let mut v = Vec::with_capacity(r.len());
            for &(var, row, i) in r {
                let src = events.get(i as usize).ok_or_else(corrupt)?;
                if first_ts.is_none() {
                    first_ts = Some(src.ts());
                }
                let ev = evs.entry(i).or_insert_with(|| src.to_ev(py)).clone();
                v.push(Cap { var, row, ev });
            }
            Ok(Caps::new(CapVec::from(v)))
        };
        let mut out_runs = Vec::with_capacity(runs.len());
        for r in runs {
            let tpart = r.tpart.as_ref().map(&mut caps).transpose()?;
            let mut es = Vec::with_capacity(r.entries.len());
            for (pos, c) in &r.entries {
                es.push(Entry { pos: *pos, caps: caps(c)? });
            }
            out_runs.push(Run { start: r.start, entries: es, tpart, matched: r.matched });
        }
        let deadline = deadline.map(|x| x.wrapping_add(first_ts.unwrap_or(0)));
        parts.push((fp, MState { row, runs: out_runs, deadline }));
    }
    Ok(Decoded { parts, buffer, events })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Capture lists of every shape the encoder chooses between (suffixes and prefixes of the
    /// previous list, continuations, variables past 7, rows and event indexes that go back)
    /// read back as written, in sequence (each list refers to the one before).
    #[test]
    fn capture_lists_round_trip() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rnd = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let start = 40i64;
        let mut lists: Vec<RawCaps> = Vec::new();
        for k in 0..3000 {
            let prev = lists.last().cloned().unwrap_or_default();
            let cur: RawCaps = match (k % 4, prev.is_empty()) {
                (0, false) => prev[rnd(prev.len() as u64) as usize..].to_vec(),
                (1, false) => {
                    let mut v = prev[..=rnd(prev.len() as u64) as usize].to_vec();
                    for _ in 0..rnd(3) {
                        let &(var, row, i) = v.last().expect("not empty");
                        v.push((var + rnd(2) as u32, row + 1, i + 1));
                    }
                    v
                }
                _ => {
                    let (mut row, mut i) = (start + rnd(5) as i64 - 2, rnd(6) as u32);
                    let mut v = Vec::new();
                    for _ in 0..rnd(7) {
                        let var = if rnd(4) == 0 { rnd(12) as u32 } else { 0 };
                        v.push((var, row, i));
                        row += if rnd(3) == 0 { rnd(5) as i64 - 2 } else { 1 };
                        i = if rnd(3) == 0 { rnd(8) as u32 } else { i + 1 };
                    }
                    v
                }
            };
            lists.push(cur);
        }
        let mut out = Vec::new();
        let mut prev: RawCaps = Vec::new();
        for l in &lists {
            put_cap_list(&mut out, l, &prev, start);
            prev.clone_from(l);
        }
        let mut d = Dec { data: &out, at: 0, var: true };
        let mut prev: RawCaps = Vec::new();
        for l in &lists {
            assert_eq!(&raw_caps(&mut d, start, &mut prev).expect("decodes"), l);
        }
        assert_eq!(d.at, out.len());
    }

    /// A capture count from corrupt bytes is an error, never a huge allocation or a loop over it
    /// (one segment may stand for many continued captures).
    #[test]
    fn huge_capture_count_is_corrupt() {
        let mut out = Vec::new();
        put_uv(&mut out, (1u64 << 40) << 2); // a new list of 2^40 captures
        put_uv(&mut out, ((1u64 << 39) << 3) | 1); // one segment continued 2^39 times
        put_iv(&mut out, 0);
        put_iv(&mut out, 0);
        let mut d = Dec { data: &out, at: 0, var: true };
        assert!(raw_caps(&mut d, 0, &mut Vec::new()).is_err());
    }
}
