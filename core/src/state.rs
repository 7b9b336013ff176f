//! The serialised form of a key's matcher state.
//!
//! Layout: magic `CEPNS`, u16 format VERSION (little endian), then the structure with each
//! event referenced by its index in an event table, then the event table. Version 2: integers
//! are varints (`evcodec`) and the table is as `evcodec` writes it (rows natively, Python
//! objects pickled). Version 1 (still read): fixed little-endian integers, the events' times,
//! then their Python objects `(events, seqs)` pickled. Another magic or version
//! fails with a clear message instead of misreading an old checkpoint.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::evcodec::{decode_events, put_iv, put_uv, Dec, EvEnc, EvOwned, EvRef};
use crate::expr::{Cap, CapVec, Caps, Ev};
use crate::matcher::{Entry, MState, Run};

pub const MAGIC: &[u8; 5] = b"CEPNS";
pub const VERSION: u16 = 2;

struct Enc {
    buf: Vec<u8>,
    index: HashMap<*const u8, u32>,
    events: Vec<Ev>,
}

impl Enc {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u32(&mut self, v: u32) {
        put_uv(&mut self.buf, u64::from(v));
    }
    fn i64(&mut self, v: i64) {
        put_iv(&mut self.buf, v);
    }
    fn opt(&mut self, v: Option<i64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.i64(x);
            }
        }
    }
    fn caps(&mut self, caps: &[Cap]) {
        self.u32(caps.len() as u32);
        for c in caps {
            let p = c.ev.as_ptr();
            let i = match self.index.get(&p) {
                Some(&i) => i,
                None => {
                    let i = self.events.len() as u32;
                    self.index.insert(p, i);
                    self.events.push(c.ev.clone());
                    i
                }
            };
            self.u32(c.var);
            self.i64(c.row);
            self.u32(i);
        }
    }
}

pub fn encode(py: Python<'_>, s: &MState) -> PyResult<Py<PyAny>> {
    let buf = encode_vec(py, s)?;
    Ok(PyBytes::new(py, &buf).into_any().unbind())
}

pub fn encode_vec(py: Python<'_>, s: &MState) -> PyResult<Vec<u8>> {
    let mut e = Enc { buf: Vec::with_capacity(256), index: HashMap::new(), events: Vec::new() };
    e.buf.extend_from_slice(MAGIC);
    e.buf.extend_from_slice(&VERSION.to_le_bytes());
    e.i64(s.row);
    e.opt(s.deadline);
    e.u32(s.runs.len() as u32);
    for r in &s.runs {
        e.i64(r.start);
        e.u8(r.matched as u8);
        match &r.tpart {
            None => e.u8(0),
            Some(t) => {
                e.u8(1);
                e.caps(t);
            }
        }
        e.u32(r.entries.len() as u32);
        for en in &r.entries {
            e.i64(i64::from(en.pos));
            e.caps(&en.caps);
        }
    }
    let events: Vec<Ev> = std::mem::take(&mut e.events);
    let mut enc = EvEnc::default();
    for ev in &events {
        let r = match ev.row() {
            Some(row) => EvRef::Row { row, seq: ev.seqi },
            None => EvRef::Py { data: ev.obj(py)?.clone_ref(py), seq: ev.seq_obj(py)?.clone_ref(py) },
        };
        enc.push(py, ev.ts, r);
    }
    enc.finish(py, &mut e.buf)?;
    Ok(e.buf)
}

fn corrupt() -> PyErr {
    PyValueError::new_err("native matcher state: truncated or corrupt bytes")
}

fn raw_caps(d: &mut Dec<'_>) -> PyResult<Vec<(u32, i64, u32)>> {
    let n = d.u32()? as usize;
    let mut v = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        v.push((d.u32()?, d.i64()?, d.u32()?));
    }
    Ok(v)
}

type RawCaps = Vec<(u32, i64, u32)>;
type RawRun = (i64, bool, Option<RawCaps>, Vec<(i32, RawCaps)>);

pub fn decode(py: Python<'_>, data: &[u8]) -> PyResult<MState> {
    if data.len() < 7 || &data[..5] != MAGIC {
        return Err(PyValueError::new_err("not a native matcher state (cep._core): wrong header"));
    }
    let version = u16::from_le_bytes([data[5], data[6]]);
    if version != VERSION && version != 1 {
        return Err(PyValueError::new_err(format!(
            "native matcher state format version {version}, but this cep._core reads version \
             {VERSION}: the state was written by another release; discard it (reset the \
             checkpoint) or replay the input"
        )));
    }
    let mut d = Dec { data, at: 7, var: version >= 2 };
    let row = d.i64()?;
    let deadline = d.opt()?;
    let nruns = d.u32()? as usize;
    let mut raw: Vec<RawRun> = Vec::new();
    for _ in 0..nruns {
        let start = d.i64()?;
        let matched = d.u8()? != 0;
        let tpart = if d.u8()? == 0 { None } else { Some(raw_caps(&mut d)?) };
        let n = d.u32()? as usize;
        let mut entries = Vec::new();
        for _ in 0..n {
            let pos = d.i32()?;
            entries.push((pos, raw_caps(&mut d)?));
        }
        raw.push((start, matched, tpart, entries));
    }
    let mut events = Vec::new();
    if version == 1 {
        let nev = d.u32()? as usize;
        let mut ts = Vec::with_capacity(nev.min(1 << 16));
        for _ in 0..nev {
            ts.push(d.i64()?);
        }
        let rest = &data[d.at..];
        let loaded = py.import("pickle")?.getattr("loads")?.call1((PyBytes::new(py, rest),))?;
        let objs = loaded.get_item(0)?;
        let seqs = loaded.get_item(1)?;
        for (i, t) in ts.into_iter().enumerate() {
            events.push(Ev::from_py(objs.get_item(i)?.unbind(), seqs.get_item(i)?.unbind(), t));
        }
    } else {
        for (t, ev) in decode_events(py, &mut d)? {
            events.push(match ev {
                EvOwned::Py { data, seq } => Ev::from_py(data, seq, t),
                EvOwned::Row { row, seq } => Ev::from_row_lazy(row, seq, t),
            });
        }
    }
    let caps = |r: &RawCaps| -> PyResult<Caps> {
        let mut v = Vec::with_capacity(r.len());
        for &(var, row, i) in r {
            let ev = events.get(i as usize).ok_or_else(corrupt)?.clone();
            v.push(Cap { var, row, ev });
        }
        Ok(Caps::new(CapVec::from(v)))
    };
    let mut runs = Vec::with_capacity(raw.len());
    for (start, matched, tpart, entries) in raw {
        let tpart = tpart.as_ref().map(&caps).transpose()?;
        let mut es = Vec::with_capacity(entries.len());
        for (pos, c) in &entries {
            es.push(Entry { pos: *pos, caps: caps(c)? });
        }
        runs.push(Run { start, entries: es, tpart, matched });
    }
    Ok(MState { row, runs, deadline })
}
