//! Events given as JSON text (the live job's `data` column) become `Row`s here, with the
//! values Python's `json.loads` would give: an object's fields in their order (a repeated field
//! keeps its first place and its last value), integers that fit 64 bits as `Int`, other
//! numbers as `Float` (rounded as Python rounds them), nested arrays and objects as the Python
//! objects `json.loads` makes.
//!
//! What serde_json reads differently from Python is handed to `json.loads` itself: text it
//! refuses (`NaN`, lone surrogates, numbers out of range) and any run of 20 or more digits (an
//! integer that may not fit 64 bits, which serde_json would round to a float).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::expr::{Cols, Row};
use crate::value::Value;

/// The column names of the last distinct field list seen: events of one stream usually share
/// their fields and order, so their rows share one `Cols`.
#[derive(Default)]
pub struct ColsCache {
    last: Option<Arc<Cols>>,
}

impl ColsCache {
    pub fn cols(&mut self, py: Python<'_>, names: Vec<String>) -> Arc<Cols> {
        if let Some(c) = &self.last {
            if c.names == names {
                return c.clone();
            }
        }
        let c = Arc::new(Cols {
            py_names: names.iter().map(|n| PyString::intern(py, n).unbind()).collect(),
            names,
        });
        self.last = Some(c.clone());
        c
    }
}

fn long_digit_run(text: &str) -> bool {
    let mut run = 0;
    for b in text.bytes() {
        if b.is_ascii_digit() {
            run += 1;
            if run >= 20 {
                return true;
            }
        } else {
            run = 0;
        }
    }
    false
}

/// One JSON object's text → a row. An error names what is wrong (not an object, not JSON).
pub fn parse_row(py: Python<'_>, text: &str, cache: &mut ColsCache) -> PyResult<Row> {
    if !long_digit_run(text) {
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) {
            let mut names = Vec::with_capacity(map.len());
            let mut vals = Vec::with_capacity(map.len());
            for (k, v) in map {
                names.push(k);
                vals.push(value_of(py, v)?);
            }
            return Ok(Row { cols: cache.cols(py, names), vals });
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
    use super::long_digit_run;

    #[test]
    fn twenty_digits_go_to_python() {
        assert!(!long_digit_run(r#"{"a": 9223372036854775807}"#));
        assert!(long_digit_run(r#"{"a": 92233720368547758070}"#));
        assert!(!long_digit_run(r#"{"a": "1234567890", "b": 1234567890}"#));
    }
}
