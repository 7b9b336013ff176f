//! The events inside a serialised key or matcher state (format version 2): rows read by the core
//! (from Arrow or JSON) are written natively, without Python; events that came in as Python
//! objects, and Python values inside rows, go into one pickled tail (absent when there is none).
//!
//! Integers are LEB128 varints (`uv`; signed ones zigzag-encoded first, `iv`), floats 8 bytes
//! little endian. Layout: the number of column tables, each a count and that many names
//! (length + UTF-8); the number of events, each its time (`iv`) and a kind byte: 0 = Python
//! (the index of its `(data, seq)` in the tail), 1 = row (seq `iv`, column table, then one value
//! per column); then the number of Python objects and, when not 0, their list pickled.
//! A value is a tag byte: 0 null, 1 false, 2 true, 3 int (`iv`), 4 f64, 5 string (length +
//! UTF-8), 6 Python object (index in the tail).

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};

use crate::expr::{Cols, Row, RowRef};
use crate::value::Value;

/// One event to write: its Python objects, or its row.
pub enum EvRef<'a> {
    Py { data: Py<PyAny>, seq: Py<PyAny> },
    Row { row: RowRef<'a>, seq: i64 },
}

/// One event read back.
pub enum EvOwned {
    Py { data: Py<PyAny>, seq: Py<PyAny> },
    Row { row: Row, seq: i64 },
}

#[derive(Default)]
pub struct EvEnc {
    tables: Vec<Arc<Cols>>,
    table_of: HashMap<*const Cols, u32>,
    body: Vec<u8>,
    count: u32,
    tail: Vec<Py<PyAny>>,
}

/// An unsigned LEB128 varint.
pub fn put_uv(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// A signed varint (zigzag, then LEB128).
pub fn put_iv(b: &mut Vec<u8>, v: i64) {
    put_uv(b, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_u32(b: &mut Vec<u8>, v: u32) {
    put_uv(b, u64::from(v));
}

pub fn put_str(b: &mut Vec<u8>, s: &str) {
    put_u32(b, s.len() as u32);
    b.extend_from_slice(s.as_bytes());
}

impl EvEnc {
    pub fn push(&mut self, py: Python<'_>, ts: i64, ev: EvRef<'_>) {
        self.count += 1;
        put_iv(&mut self.body, ts);
        match ev {
            EvRef::Py { data, seq } => {
                self.body.push(0);
                put_u32(&mut self.body, self.tail.len() as u32);
                self.tail.push(data);
                self.tail.push(seq);
            }
            EvRef::Row { row, seq } => {
                self.body.push(1);
                put_iv(&mut self.body, seq);
                let p = Arc::as_ptr(row.cols);
                let t = match self.table_of.get(&p) {
                    Some(&t) => t,
                    None => {
                        let t = self.tables.len() as u32;
                        self.tables.push(row.cols.clone());
                        self.table_of.insert(p, t);
                        t
                    }
                };
                put_u32(&mut self.body, t);
                for v in row.vals {
                    match v {
                        Value::Null => self.body.push(0),
                        Value::Bool(false) => self.body.push(1),
                        Value::Bool(true) => self.body.push(2),
                        Value::Int(i) => {
                            self.body.push(3);
                            put_iv(&mut self.body, *i);
                        }
                        Value::Float(f) => {
                            self.body.push(4);
                            self.body.extend_from_slice(&f.to_le_bytes());
                        }
                        Value::Str(s) => {
                            self.body.push(5);
                            put_str(&mut self.body, s);
                        }
                        Value::Py(o) => {
                            self.body.push(6);
                            put_u32(&mut self.body, self.tail.len() as u32);
                            self.tail.push(o.clone_ref(py));
                        }
                    }
                }
            }
        }
    }

    pub fn finish(self, py: Python<'_>, out: &mut Vec<u8>) -> PyResult<()> {
        put_u32(out, self.tables.len() as u32);
        for t in &self.tables {
            put_u32(out, t.names.len() as u32);
            for n in &t.names {
                put_str(out, n);
            }
        }
        put_u32(out, self.count);
        out.extend_from_slice(&self.body);
        put_u32(out, self.tail.len() as u32);
        if !self.tail.is_empty() {
            let list = PyList::new(py, self.tail)?;
            let pickled = py.import("pickle")?.getattr("dumps")?.call1((list, 5))?;
            out.extend_from_slice(pickled.downcast::<PyBytes>()?.as_bytes());
        }
        Ok(())
    }
}

fn corrupt() -> PyErr {
    PyValueError::new_err("native state: truncated or corrupt event bytes")
}

/// A reader over serialised bytes: `u32`/`i64`/`i32` read varints when `var` (format version
/// 2), fixed little-endian integers otherwise (version 1, still read).
pub struct Dec<'a> {
    pub data: &'a [u8],
    pub at: usize,
    pub var: bool,
}

impl Dec<'_> {
    pub fn take(&mut self, n: usize) -> PyResult<&[u8]> {
        let end = self.at.checked_add(n).ok_or_else(corrupt)?;
        let s = self.data.get(self.at..end).ok_or_else(corrupt)?;
        self.at = end;
        Ok(s)
    }
    pub fn u8(&mut self) -> PyResult<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn uv(&mut self) -> PyResult<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt())
    }
    pub fn iv(&mut self) -> PyResult<i64> {
        let u = self.uv()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }
    pub fn u32(&mut self) -> PyResult<u32> {
        if self.var {
            return u32::try_from(self.uv()?).map_err(|_| corrupt());
        }
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| corrupt())?))
    }
    pub fn i64(&mut self) -> PyResult<i64> {
        if self.var {
            return self.iv();
        }
        Ok(i64::from_le_bytes(self.take(8)?.try_into().map_err(|_| corrupt())?))
    }
    pub fn i32(&mut self) -> PyResult<i32> {
        if self.var {
            return i32::try_from(self.iv()?).map_err(|_| corrupt());
        }
        Ok(i32::from_le_bytes(self.take(4)?.try_into().map_err(|_| corrupt())?))
    }
    pub fn opt(&mut self) -> PyResult<Option<i64>> {
        Ok(if self.u8()? == 0 { None } else { Some(self.i64()?) })
    }
    /// A u32 length, then that many bytes.
    pub fn take_n(&mut self) -> PyResult<&[u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn f64(&mut self) -> PyResult<f64> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().map_err(|_| corrupt())?))
    }
    fn string(&mut self) -> PyResult<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| corrupt())
    }
}

enum Slot {
    Py(usize),
    Row(i64, u32, Vec<Value>, Vec<(usize, usize)>),
}

/// Read what `EvEnc::finish` wrote: the events in order, each with its time.
pub fn decode_events(py: Python<'_>, d: &mut Dec<'_>) -> PyResult<Vec<(i64, EvOwned)>> {
    let ntables = d.u32()? as usize;
    let mut tables = Vec::with_capacity(ntables.min(1 << 12));
    for _ in 0..ntables {
        let n = d.u32()? as usize;
        let mut names = Vec::with_capacity(n.min(1 << 12));
        for _ in 0..n {
            names.push(d.string()?);
        }
        tables.push(Arc::new(Cols {
            py_names: names.iter().map(|n| PyString::intern(py, n).unbind()).collect(),
            names,
        }));
    }
    let nev = d.u32()? as usize;
    let mut slots = Vec::with_capacity(nev.min(1 << 16));
    for _ in 0..nev {
        let ts = d.i64()?;
        match d.u8()? {
            0 => slots.push((ts, Slot::Py(d.u32()? as usize))),
            1 => {
                let seq = d.i64()?;
                let t = d.u32()?;
                let ncols = tables.get(t as usize).ok_or_else(corrupt)?.names.len();
                let mut vals = Vec::with_capacity(ncols);
                let mut py_at = Vec::new();
                for c in 0..ncols {
                    vals.push(match d.u8()? {
                        0 => Value::Null,
                        1 => Value::Bool(false),
                        2 => Value::Bool(true),
                        3 => Value::Int(d.i64()?),
                        4 => Value::Float(d.f64()?),
                        5 => Value::Str(Arc::from(d.string()?)),
                        6 => {
                            py_at.push((c, d.u32()? as usize));
                            Value::Null
                        }
                        _ => return Err(corrupt()),
                    });
                }
                slots.push((ts, Slot::Row(seq, t, vals, py_at)));
            }
            _ => return Err(corrupt()),
        }
    }
    let ntail = d.u32()? as usize;
    let tail = if ntail == 0 {
        None
    } else {
        let rest = &d.data[d.at..];
        d.at = d.data.len();
        Some(py.import("pickle")?.getattr("loads")?.call1((PyBytes::new(py, rest),))?)
    };
    let get = |i: usize| -> PyResult<Py<PyAny>> {
        match &tail {
            Some(t) => Ok(t.get_item(i)?.unbind()),
            None => Err(corrupt()),
        }
    };
    let mut out = Vec::with_capacity(slots.len());
    for (ts, slot) in slots {
        out.push((ts, match slot {
            Slot::Py(i) => EvOwned::Py { data: get(i)?, seq: get(i + 1)? },
            Slot::Row(seq, t, mut vals, py_at) => {
                for (c, i) in py_at {
                    vals[c] = Value::Py(Arc::new(get(i)?));
                }
                EvOwned::Row { row: Row { cols: tables[t as usize].clone(), vals }, seq }
            }
        }));
    }
    Ok(out)
}
