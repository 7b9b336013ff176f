//! Events given as JSON text (the live job's `data` column) become `Row`s here, with the
//! values Python's `json.loads` would give: an object's fields in their order (a repeated field
//! keeps its first place and its last value), integers that fit 64 bits as `Int`, other
//! numbers as `Float` (rounded as Python rounds them), nested arrays and objects as the Python
//! objects `json.loads` makes.
//!
//! What serde_json reads differently from Python is handed to `json.loads` itself: text it
//! refuses (`NaN`, lone surrogates, numbers out of range) and any run of 20 or more digits (an
//! integer that may not fit 64 bits, which serde_json would round to a float).

use std::borrow::Cow;
use std::collections::HashMap as StdHashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::expr::{Cols, Row};
use crate::value::Value;

type HashMap<K, V> = StdHashMap<K, V, foldhash::fast::RandomState>;

/// The column names of the last distinct field list seen: events of one stream usually share
/// their fields and order, so their rows share one `Cols`. The `SHAPES` most recently used
/// lists are kept too (rows with optional fields alternate between some), so a list used
/// lately is not built and its names interned again. One cache per ingest call.
#[derive(Default)]
pub struct ColsCache {
    /// Most recently used last.
    recent: Vec<(u64, Arc<Cols>)>,
}

/// How many field lists `ColsCache` keeps: the most recently used.
const SHAPES: usize = 8;

impl ColsCache {
    /// The list the last `cols` returned.
    fn last(&self) -> Option<&Arc<Cols>> {
        self.recent.last().map(|(_, c)| c)
    }

    pub fn cols(&mut self, py: Python<'_>, names: Vec<String>) -> Arc<Cols> {
        if let Some(c) = self.last() {
            if c.names == names {
                return c.clone();
            }
        }
        let h = foldhash::fast::FixedState::default().hash_one(&names);
        let c = match self.recent.iter().position(|(k, c)| *k == h && c.names == names) {
            // Used again: it moves to the end, evicted last.
            Some(i) => {
                self.recent[i..].rotate_left(1);
                self.recent[self.recent.len() - 1].1.clone()
            }
            None => {
                let c = Arc::new(Cols {
                    py_names: names.iter().map(|n| PyString::intern(py, n).unbind()).collect(),
                    names,
                });
                if self.recent.len() == SHAPES {
                    self.recent.remove(0);
                }
                self.recent.push((h, c.clone()));
                c
            }
        };
        c
    }
}

/// Text serde_json reads differently from `json.loads`, handed to Python: a run of 20 or more
/// digits (an integer that may not fit 64 bits: serde_json would round it to a float), a
/// negative run of 19 (below `i64::MIN` the same), and the integer `-0` (serde_json: `-0.0`;
/// Python: `0`). A match inside a string costs only the slower path.
fn python_reads_differently(text: &str) -> bool {
    let b = text.as_bytes();
    let mut run = 0;
    for (i, &c) in b.iter().enumerate() {
        if !c.is_ascii_digit() {
            run = 0;
            continue;
        }
        run += 1;
        if run >= 20 || (run == 19 && i >= 19 && b[i - 19] == b'-') {
            return true;
        }
        if run == 1 && c == b'0' && i > 0 && b[i - 1] == b'-'
            && !matches!(b.get(i + 1), Some(b'.' | b'e' | b'E' | b'0'..=b'9'))
        {
            return true;
        }
    }
    false
}

/// One JSON object's text → a row. An error names what is wrong (not an object, not JSON).
pub fn parse_row(py: Python<'_>, text: &str, cache: &mut ColsCache) -> PyResult<Row> {
    if !python_reads_differently(text) {
        let mut de = serde_json::Deserializer::from_str(text);
        if let Ok(row) = (RowSeed { py, cache: &mut *cache }).deserialize(&mut de) {
            if de.end().is_ok() {
                return Ok(row);
            }
        }
    }
    let obj = py.import("json")?.getattr("loads")?.call1((text,))?;
    let dict = obj.downcast::<PyDict>().map_err(|_| {
        pyo3::exceptions::PyValueError::new_err("an event's JSON text is not an object")
    })?;
    let mut names = Vec::with_capacity(dict.len());
    let mut vals = Vec::with_capacity(dict.len());
    for (k, v) in dict.iter() {
        names.push(k.downcast::<PyString>()?.to_str()?.to_owned());
        vals.push(Value::from_py(&v));
    }
    Ok(Row { cols: cache.cols(py, names), vals })
}

/// Reads an object straight into a row: no map and no key strings while its field names are
/// those of the last row (`ColsCache`), the usual case. The values are what `value_of` makes
/// of serde_json's own `Value` (the same visitor calls reach both).
struct RowSeed<'a, 'py> {
    py: Python<'py>,
    cache: &'a mut ColsCache,
}

impl<'de> DeserializeSeed<'de> for RowSeed<'_, '_> {
    type Value = Row;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Row, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_, '_> {
    type Value = Row;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Row, A::Error> {
        let last = self.cache.last().cloned();
        let same: &[String] = last.as_ref().map_or(&[], |c| &c.names);
        // None while the names so far are `same`'s first ones.
        let mut names: Option<Vec<String>> = None;
        let mut vals: Vec<Value> = Vec::with_capacity(same.len().max(4));
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let value = map.next_value_seed(ValueSeed(self.py))?;
            if names.is_none() {
                if same.get(vals.len()).is_some_and(|n| *n == *key) {
                    vals.push(value);
                    continue;
                }
                names = Some(same[..vals.len()].to_vec());
            }
            let names = names.as_mut().expect("set above");
            if names.len() >= WIDE {
                // A wide row: fields pushed as they come, repeats merged after the object.
                names.push(key.into_owned());
                vals.push(value);
                continue;
            }
            match names.iter().position(|n| *n == *key) {
                // A repeated field keeps its first place and its last value.
                Some(p) => vals[p] = value,
                None => {
                    names.push(key.into_owned());
                    vals.push(value);
                }
            }
        }
        if let Some(ns) = names.as_mut().filter(|ns| ns.len() > WIDE) {
            merge_repeated(ns, &mut vals);
        }
        let names = match names {
            None if same.len() == vals.len() && last.is_some() => None,
            None => Some(same[..vals.len()].to_vec()),
            some => some,
        };
        let cols = match names {
            None => last.expect("matched its names"),
            Some(names) => self.cache.cols(self.py, names),
        };
        Ok(Row { cols, vals })
    }
}

/// From this many fields on, a row's names are not searched for each new field (quadratic in
/// the width: 20k string compares for 200 fields) but checked for repeats once, by hashing.
const WIDE: usize = 16;

/// A repeated field keeps its first place and its last value (as `json.loads` builds a dict):
/// one pass over the names through a map from a name to its place, then one move of the values.
fn merge_repeated(names: &mut Vec<String>, vals: &mut Vec<Value>) {
    let mut first: HashMap<&str, usize> =
        HashMap::with_capacity_and_hasher(names.len(), Default::default());
    let places: Vec<usize> = names
        .iter()
        .map(|n| {
            let next = first.len();
            *first.entry(n.as_str()).or_insert(next)
        })
        .collect();
    let distinct = first.len();
    if distinct == names.len() {
        return;
    }
    let mut first_names: Vec<String> = Vec::with_capacity(distinct);
    let mut first_vals: Vec<Value> = Vec::with_capacity(distinct);
    for ((n, v), p) in names.drain(..).zip(vals.drain(..)).zip(places) {
        if p == first_names.len() {
            first_names.push(n);
            first_vals.push(v);
        } else {
            first_vals[p] = v;
        }
    }
    *names = first_names;
    *vals = first_vals;
}

/// A field name, borrowed from the text when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a field name")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// A field's value as `value_of` would make it from serde_json's `Value`.
struct ValueSeed<'py>(Python<'py>);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

fn py_err<E: de::Error>(e: PyErr) -> E {
    E::custom(e)
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        match i64::try_from(v) {
            Ok(i) => Ok(Value::Int(i)),
            Err(_) => value_of(self.0, serde_json::Value::from(v)).map_err(py_err),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(Arc::from(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Value, A::Error> {
        let v = serde_json::Value::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
        value_of(self.0, v).map_err(py_err)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        let v = serde_json::Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
        value_of(self.0, v).map_err(py_err)
    }
}

fn value_of(py: Python<'_>, v: serde_json::Value) -> PyResult<Value> {
    Ok(match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(b),
        serde_json::Value::String(s) => Value::Str(Arc::from(s)),
        serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::Int(i),
            (None, Some(u), _) => Value::Py(Arc::new(u.into_pyobject(py)?.into_any().unbind())),
            (None, None, Some(f)) => Value::Float(f),
            _ => Value::Null,
        },
        nested => Value::Py(Arc::new(py_of(py, nested)?)),
    })
}

fn py_of(py: Python<'_>, v: serde_json::Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        serde_json::Value::Array(items) => {
            let l = PyList::empty(py);
            for it in items {
                l.append(py_of(py, it)?)?;
            }
            l.into_any().unbind()
        }
        serde_json::Value::Object(map) => {
            let d = PyDict::new(py);
            for (k, it) in map {
                d.set_item(k, py_of(py, it)?)?;
            }
            d.into_any().unbind()
        }
        scalar => value_of(py, scalar)?.to_py(py)?,
    })
}

#[cfg(test)]
mod tests {
    use super::python_reads_differently as python;
    use super::{merge_repeated, Value};

    /// As `json.loads`: each name once, at its first place, with its last value.
    #[test]
    fn repeated_fields_keep_first_place_and_last_value() {
        let mut names: Vec<String> = ["a", "b", "a", "c", "b", "a"].map(String::from).to_vec();
        let mut vals: Vec<Value> = (0..6).map(Value::Int).collect();
        merge_repeated(&mut names, &mut vals);
        assert_eq!(names, ["a", "b", "c"]);
        let ints: Vec<i64> =
            vals.iter().map(|v| if let Value::Int(i) = v { *i } else { -1 }).collect();
        assert_eq!(ints, [5, 4, 3]);
        let mut names: Vec<String> = ["x", "y"].map(String::from).to_vec();
        let mut vals = vec![Value::Int(1), Value::Int(2)];
        merge_repeated(&mut names, &mut vals);
        assert_eq!((names.len(), vals.len()), (2, 2));
    }

    #[test]
    fn what_serde_json_reads_differently_goes_to_python() {
        assert!(!python(r#"{"a": 9223372036854775807}"#));
        assert!(python(r#"{"a": 92233720368547758070}"#));
        assert!(!python(r#"{"a": "1234567890", "b": 1234567890}"#));
        assert!(python(r#"{"a": -9223372036854775809}"#));
        assert!(!python(r#"{"a": 9223372036854775808}"#));
        assert!(python(r#"{"a":-0}"#) && python(r#"{"a": [-0, 1]}"#));
        assert!(!python(r#"{"a": -0.0, "b": -0e1, "c": -01.5, "d": -10}"#));
    }
}
