//! A key's state as bytes, format version 3 (`CEPNK` v3; `engine.rs` still reads v1 and v2).
//!
//! What v2 wrote per rule of a key (its own event table, its own column-name tables, the rule's
//! id and version as text, fixed deadlines) is shared or shortened here:
//!
//! - one event table per key, shared by every rule's partial matches and the key's buffer
//!   (the rules of a group see the same events: `velocity` and `impossible_travel` hold the
//!   same last event once, not twice);
//! - column-name tables deduplicated by content (a key whose events were read back from bytes
//!   and new events parsed since held two identical tables in v2, one per decode: the state
//!   grew with every store round trip);
//! - a rule is named by a 32-bit fingerprint of its id and version (FNV-1a), not their text;
//! - values: an integer equal to the event's time, a string equal to the key, a float that is
//!   an exact number of hundredths, and a string already written in this key's bytes each take
//!   one tag byte (plus a short varint for the last two);
//! - event times and sequence numbers are deltas from the previous event's (zigzag varints);
//!   a partial match's captured rows are deltas from the previous capture's.
//!
//! Layout (integers are LEB128 varints, `iv` signed/zigzag, `uv` unsigned):
//! ```text
//! "CEPNK" u16le 3
//! uv nparts, per part: u32le fingerprint, then the matcher state:
//!     iv row; uv nruns, per run: iv (row - start), u8 flags (1 matched, 2 has tpart),
//!     [caps tpart], uv nentries, per entry: uv (pos + 1), caps;
//!     u8 has deadline, [iv deadline - time of the part's first event, or absolute when none]
//!   caps: uv n, per capture: uv var, iv (row - previous row; the first from the run start),
//!     uv event index
//! column tables: uv n, per table uv ncols and the names (uv length + UTF-8)
//! events: uv n, per event: iv (ts - previous ts), u8 kind: 0 Python (uv index of its
//!   (data, seq) in the tail), 1 row (iv seq - previous row seq, uv table, one value per column)
//!   value tags: 0 null, 1 false, 2 true, 3 int iv, 4 f64le, 5 str (uv len + UTF-8),
//!   6 Python (uv tail index), 7 int = the event's time, 8 str = the key,
//!   9 float = iv n / 100 (exact), 10 str = the n-th string written before (uv n)
//! buffer: uv n, per buffered event its uv event index
//! tail: uv n, then (when not 0) the list of Python objects pickled
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::evcodec::{put_iv, put_str, put_uv, Dec};
use crate::expr::{Cap, CapVec, Caps, Cols, Ev, Row};
use crate::matcher::{Entry, MState, Run};
use crate::value::Value;

pub const VERSION: u16 = 3;

/// FNV-1a (32 bits) of a rule's id and version: how a v3 key state names a rule's part.
pub fn fingerprint(rule: &str, version: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in rule.bytes().chain(std::iter::once(0xff)).chain(version.bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// One event of the key's table as the encoder sees it.
pub enum Src<'a> {
    Row { row: &'a Arc<Row>, seq: i64, ts: i64 },
    Py { data: Py<PyAny>, seq: Py<PyAny>, ts: i64 },
}

#[derive(Hash, PartialEq, Eq, Clone, Copy)]
enum Id {
    Row(usize, i64, i64),
    Py(usize, usize, i64),
}

pub struct KeyEnc<'k, 'a> {
    key: &'k str,
    parts: Vec<u8>,
    index: HashMap<Id, u32>,
    events: Vec<Src<'a>>,
}

/// What a decoded key gives back: per part (fingerprint, state), the buffer as event indexes,
/// and the events.
pub struct Decoded {
    pub parts: Vec<(u32, MState)>,
    pub buffer: Vec<usize>,
    pub events: Vec<Arc<DEv>>,
}

/// A decoded event: a row or Python objects, with its time (shared by every part that holds
/// it; each part builds its own `Ev` on it, as a rule projects rows on its own fields).
pub enum DEv {
    Row { row: Arc<Row>, seq: i64, ts: i64 },
    Py { data: Py<PyAny>, seq: Py<PyAny>, ts: i64 },
}

impl DEv {
    pub fn ts(&self) -> i64 {
        match self {
            DEv::Row { ts, .. } | DEv::Py { ts, .. } => *ts,
        }
    }

    pub fn to_ev(&self, py: Python<'_>) -> Ev {
        match self {
            DEv::Row { row, seq, ts } => Ev::from_row_lazy(row.clone(), *seq, *ts),
            DEv::Py { data, seq, ts } => Ev::from_py(data.clone_ref(py), seq.clone_ref(py), *ts),
        }
    }
}

impl<'k, 'a> KeyEnc<'k, 'a> {
    pub fn new(key: &'k str) -> Self {
        KeyEnc { key, parts: Vec::with_capacity(64), index: HashMap::new(), events: Vec::new() }
    }

    /// The index of an event in the key's table (added when new).
    pub fn event(&mut self, src: Src<'a>) -> u32 {
        let id = match &src {
            Src::Row { row, seq, ts } => Id::Row(Arc::as_ptr(row) as usize, *seq, *ts),
            Src::Py { data, seq, ts } => Id::Py(data.as_ptr() as usize, seq.as_ptr() as usize, *ts),
        };
        if let Some(&i) = self.index.get(&id) {
            return i;
        }
        let i = self.events.len() as u32;
        self.index.insert(id, i);
        self.events.push(src);
        i
    }

    fn ev_src(py: Python<'_>, ev: &'a Ev) -> PyResult<Src<'a>> {
        Ok(match &ev.row {
            Some(row) => Src::Row { row, seq: ev.seqi, ts: ev.ts },
            None => Src::Py { data: ev.obj(py)?.clone_ref(py), seq: ev.seq_obj(py)?.clone_ref(py), ts: ev.ts },
        })
    }

    fn caps(&mut self, py: Python<'_>, caps: &'a [Cap], start: i64, first_ts: &mut Option<i64>) -> PyResult<()> {
        put_uv(&mut self.parts, caps.len() as u64);
        let mut prev = start;
        for c in caps {
            let src = Self::ev_src(py, &c.ev)?;
            let i = self.event(src);
            if first_ts.is_none() {
                *first_ts = Some(c.ev.ts);
            }
            put_uv(&mut self.parts, u64::from(c.var));
            put_iv(&mut self.parts, c.row.wrapping_sub(prev));
            put_uv(&mut self.parts, u64::from(i));
            prev = c.row;
        }
        Ok(())
    }

    /// One rule's part.
    pub fn part(&mut self, py: Python<'_>, fp: u32, s: &'a MState) -> PyResult<()> {
        self.parts.extend_from_slice(&fp.to_le_bytes());
        put_iv(&mut self.parts, s.row);
        put_uv(&mut self.parts, s.runs.len() as u64);
        let mut first_ts = None;
        for r in &s.runs {
            put_iv(&mut self.parts, s.row.wrapping_sub(r.start));
            self.parts.push(u8::from(r.matched) | (u8::from(r.tpart.is_some()) << 1));
            if let Some(t) = &r.tpart {
                self.caps(py, t, r.start, &mut first_ts)?;
            }
            put_uv(&mut self.parts, r.entries.len() as u64);
            for e in &r.entries {
                put_uv(&mut self.parts, (i64::from(e.pos) + 1) as u64);
                self.caps(py, &e.caps, r.start, &mut first_ts)?;
            }
        }
        match s.deadline {
            None => self.parts.push(0),
            Some(d) => {
                self.parts.push(1);
                put_iv(&mut self.parts, d.wrapping_sub(first_ts.unwrap_or(0)));
            }
        }
        Ok(())
    }

    /// The whole key: `nparts` parts written, then the buffer's events (indexes in the table).
    pub fn finish(mut self, py: Python<'_>, nparts: usize, buffer: Vec<Src<'a>>) -> PyResult<Vec<u8>> {
        let buf_idx: Vec<u32> = buffer.into_iter().map(|s| self.event(s)).collect();
        let mut out = Vec::with_capacity(self.parts.len() + 32 + 24 * self.events.len());
        out.extend_from_slice(crate::engine::KEY_MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        put_uv(&mut out, nparts as u64);
        out.extend_from_slice(&self.parts);
        // Column tables, by content.
        let mut tables: Vec<&Arc<Cols>> = Vec::new();
        let mut table_of: HashMap<usize, u32> = HashMap::new();
        for e in &self.events {
            if let Src::Row { row, .. } = e {
                let p = Arc::as_ptr(&row.cols) as usize;
                if table_of.contains_key(&p) {
                    continue;
                }
                let t = match tables.iter().position(|t| t.names == row.cols.names) {
                    Some(t) => t as u32,
                    None => {
                        tables.push(&row.cols);
                        (tables.len() - 1) as u32
                    }
                };
                table_of.insert(p, t);
            }
        }
        put_uv(&mut out, tables.len() as u64);
        for t in &tables {
            put_uv(&mut out, t.names.len() as u64);
            for n in &t.names {
                put_str(&mut out, n);
            }
        }
        put_uv(&mut out, self.events.len() as u64);
        let mut tail: Vec<Py<PyAny>> = Vec::new();
        let mut strings: HashMap<&str, u32> = HashMap::new();
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
                Src::Row { row, seq, ts } => {
                    put_iv(&mut out, ts.wrapping_sub(pts));
                    pts = *ts;
                    out.push(1);
                    put_iv(&mut out, seq.wrapping_sub(pseq));
                    pseq = *seq;
                    put_uv(&mut out, u64::from(table_of[&(Arc::as_ptr(&row.cols) as usize)]));
                    for v in &row.vals {
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
    strings: &mut HashMap<&'s str, u32>,
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
        Value::Str(s) => match strings.get(&**s) {
            Some(&n) => {
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

type RawCaps = Vec<(u32, i64, u32)>;

struct RawRun {
    start: i64,
    matched: bool,
    tpart: Option<RawCaps>,
    entries: Vec<(i32, RawCaps)>,
}

fn raw_caps(d: &mut Dec<'_>, start: i64) -> PyResult<RawCaps> {
    let n = d.uv()? as usize;
    let mut v = Vec::with_capacity(n.min(1 << 12));
    let mut prev = start;
    for _ in 0..n {
        let var = u32::try_from(d.uv()?).map_err(|_| corrupt())?;
        let row = prev.wrapping_add(d.iv()?);
        let i = u32::try_from(d.uv()?).map_err(|_| corrupt())?;
        v.push((var, row, i));
        prev = row;
    }
    Ok(v)
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
        _ => return Err(corrupt()),
    })
}

/// Read `KeyEnc`'s bytes (the caller checked the magic and the version).
pub fn decode(py: Python<'_>, data: &[u8], key: &str) -> PyResult<Decoded> {
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
        for _ in 0..nruns {
            let start = row.wrapping_sub(d.iv()?);
            let flags = d.u8()?;
            let tpart = if flags & 2 != 0 { Some(raw_caps(&mut d, start)?) } else { None };
            let n = d.uv()? as usize;
            let mut entries = Vec::with_capacity(n.min(1 << 12));
            for _ in 0..n {
                let pos = i32::try_from(d.uv()? as i64 - 1).map_err(|_| corrupt())?;
                entries.push((pos, raw_caps(&mut d, start)?));
            }
            runs.push(RawRun { start, matched: flags & 1 != 0, tpart, entries });
        }
        let deadline = if d.u8()? == 0 { None } else { Some(d.iv()?) };
        raw_parts.push((fp, row, runs, deadline));
    }
    let ntables = d.uv()? as usize;
    let mut tables = Vec::with_capacity(ntables.min(1 << 10));
    for _ in 0..ntables {
        let n = d.uv()? as usize;
        let mut names = Vec::with_capacity(n.min(1 << 12));
        for _ in 0..n {
            let len = d.uv()? as usize;
            names.push(std::str::from_utf8(d.take(len)?).map_err(|_| corrupt())?.to_owned());
        }
        tables.push(Arc::new(Cols { py_names: names.iter().map(|n| PyString::intern(py, n).unbind()).collect(), names }));
    }
    let nev = d.uv()? as usize;
    enum Slot {
        Py(i64, usize),
        Row(i64, i64, u32, Vec<Value>, Vec<(usize, usize)>),
    }
    let mut slots = Vec::with_capacity(nev.min(1 << 16));
    let mut strings: Vec<Arc<str>> = Vec::new();
    let (mut pts, mut pseq) = (0i64, 0i64);
    for _ in 0..nev {
        let ts = pts.wrapping_add(d.iv()?);
        pts = ts;
        match d.u8()? {
            0 => slots.push(Slot::Py(ts, d.uv()? as usize)),
            1 => {
                let seq = pseq.wrapping_add(d.iv()?);
                pseq = seq;
                let t = u32::try_from(d.uv()?).map_err(|_| corrupt())?;
                let ncols = tables.get(t as usize).ok_or_else(corrupt)?.names.len();
                let mut vals = Vec::with_capacity(ncols);
                let mut py_at = Vec::new();
                for c in 0..ncols {
                    let mut at = Vec::new();
                    vals.push(val(&mut d, ts, &key, &mut strings, &mut at)?);
                    py_at.extend(at.into_iter().map(|i| (c, i)));
                }
                slots.push(Slot::Row(ts, seq, t, vals, py_at));
            }
            _ => return Err(corrupt()),
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
            Slot::Py(ts, i) => DEv::Py { data: get(i)?, seq: get(i + 1)?, ts },
            Slot::Row(ts, seq, t, mut vals, py_at) => {
                for (c, i) in py_at {
                    vals[c] = Value::Py(Arc::new(get(i)?));
                }
                DEv::Row { row: Arc::new(Row { cols: tables[t as usize].clone(), vals }), seq, ts }
            }
        }));
    }
    let mut parts = Vec::with_capacity(raw_parts.len());
    for (fp, row, runs, deadline) in raw_parts {
        // One `Ev` per event and part (a rule projects rows on its own fields).
        let mut evs: HashMap<u32, Arc<Ev>> = HashMap::new();
        let mut first_ts = None;
        let mut caps = |r: &RawCaps| -> PyResult<Caps> {
            let mut v = Vec::with_capacity(r.len());
            for &(var, row, i) in r {
                let src = events.get(i as usize).ok_or_else(corrupt)?;
                if first_ts.is_none() {
                    first_ts = Some(src.ts());
                }
                let ev = evs.entry(i).or_insert_with(|| Arc::new(src.to_ev(py))).clone();
                v.push(Cap { var, row, ev });
            }
            Ok(Arc::new(CapVec::from(v)))
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
