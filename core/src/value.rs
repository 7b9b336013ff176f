//! Values and Python's operator semantics on them.
//!
//! Exact builtin types (None, bool, int that fits 64 bits, float, str) are native; anything
//! else (big ints, numpy scalars, lists, dicts, subclasses) stays a Python object and every
//! operation on it is delegated to Python's own operator, so the answer is Python's. Native
//! operations reproduce CPython 3.11 exactly: int overflow and inexact int division delegate,
//! float modulo follows `float_rem`, int/float comparisons are exact.

use std::cmp::Ordering;
use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyOverflowError, PyTypeError, PyValueError, PyZeroDivisionError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyFloat, PyInt, PyList, PyString, PyTuple};

#[derive(Clone, Debug)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Arc<str>),
    Py(Arc<Py<PyAny>>),
}

impl Value {
    pub fn from_py(obj: &Bound<'_, PyAny>) -> Value {
        if obj.is_none() {
            return Value::Null;
        }
        if let Ok(b) = obj.downcast_exact::<PyBool>() {
            return Value::Bool(b.is_true());
        }
        if obj.downcast_exact::<PyInt>().is_ok() {
            if let Ok(i) = obj.extract::<i64>() {
                return Value::Int(i);
            }
        } else if let Ok(f) = obj.downcast_exact::<PyFloat>() {
            return Value::Float(f.value());
        } else if let Ok(s) = obj.downcast_exact::<PyString>() {
            if let Ok(text) = s.to_str() {
                return Value::Str(Arc::from(text));
            }
        }
        Value::Py(Arc::new(obj.clone().unbind()))
    }

    pub fn to_py(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            Value::Null => py.None(),
            Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any().unbind(),
            Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            Value::Float(f) => f.into_pyobject(py)?.into_any().unbind(),
            Value::Str(s) => PyString::new(py, s).into_any().unbind(),
            Value::Py(o) => o.clone_ref(py),
        })
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    pub fn is_true(&self) -> bool {
        matches!(self, Value::Bool(true))
    }

    pub fn is_false(&self) -> bool {
        matches!(self, Value::Bool(false))
    }

    /// The text of a str (or of a str subclass held as a Python object).
    pub fn as_str(&self, py: Python<'_>) -> Option<Arc<str>> {
        match self {
            Value::Str(s) => Some(s.clone()),
            Value::Py(o) => {
                let b = o.bind(py);
                let s = b.downcast::<PyString>().ok()?;
                s.to_str().ok().map(Arc::from)
            }
            _ => None,
        }
    }
}

/// A native number: an int (a bool counts as 0 or 1, as in Python arithmetic) or a float.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Num {
    I(i64),
    F(f64),
}

impl Num {
    pub(crate) fn value(self) -> Value {
        match self {
            Num::I(i) => Value::Int(i),
            Num::F(f) => Value::Float(f),
        }
    }
}

#[inline(always)]
pub(crate) fn num(v: &Value) -> Option<Num> {
    match v {
        Value::Bool(b) => Some(Num::I(*b as i64)),
        Value::Int(i) => Some(Num::I(*i)),
        Value::Float(f) => Some(Num::F(*f)),
        _ => None,
    }
}

#[inline(always)]
fn as_f64(n: Num) -> f64 {
    match n {
        Num::I(i) => i as f64,
        Num::F(f) => f,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArOp {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Python's `operator` functions, for values the core does not handle natively.
pub struct PyOps {
    pub add: Py<PyAny>,
    pub sub: Py<PyAny>,
    pub mul: Py<PyAny>,
    pub truediv: Py<PyAny>,
    pub mod_: Py<PyAny>,
    pub eq: Py<PyAny>,
    pub ne: Py<PyAny>,
    pub lt: Py<PyAny>,
    pub le: Py<PyAny>,
    pub gt: Py<PyAny>,
    pub ge: Py<PyAny>,
    pub neg: Py<PyAny>,
    pub abs: Py<PyAny>,
    pub len: Py<PyAny>,
    pub lower: Py<PyAny>,
    pub upper: Py<PyAny>,
    pub contains: Py<PyAny>,
}

impl PyOps {
    pub fn new(py: Python<'_>) -> PyResult<PyOps> {
        let op = py.import("operator")?;
        let b = py.import("builtins")?;
        let s = b.getattr("str")?;
        let get = |name: &str| -> PyResult<Py<PyAny>> { Ok(op.getattr(name)?.unbind()) };
        Ok(PyOps {
            add: get("add")?,
            sub: get("sub")?,
            mul: get("mul")?,
            truediv: get("truediv")?,
            mod_: get("mod")?,
            eq: get("eq")?,
            ne: get("ne")?,
            lt: get("lt")?,
            le: get("le")?,
            gt: get("gt")?,
            ge: get("ge")?,
            neg: get("neg")?,
            abs: b.getattr("abs")?.unbind(),
            len: b.getattr("len")?.unbind(),
            lower: s.getattr("lower")?.unbind(),
            upper: s.getattr("upper")?.unbind(),
            contains: get("contains")?,
        })
    }
}

/// TypeError, ZeroDivisionError and OverflowError become NULL (as `cep.expr` catches them).
fn soft(py: Python<'_>, r: PyResult<Bound<'_, PyAny>>) -> PyResult<Value> {
    match r {
        Ok(v) => Ok(Value::from_py(&v)),
        Err(e)
            if e.is_instance_of::<PyTypeError>(py)
                || e.is_instance_of::<PyZeroDivisionError>(py)
                || e.is_instance_of::<PyOverflowError>(py) =>
        {
            Ok(Value::Null)
        }
        Err(e) => Err(e),
    }
}

/// Only TypeError becomes NULL (comparisons, aggregates, functions).
fn soft_type<'py>(py: Python<'py>, r: PyResult<Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, PyAny>>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_instance_of::<PyTypeError>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn call1<'py>(py: Python<'py>, f: &Py<PyAny>, a: &Value) -> PyResult<Bound<'py, PyAny>> {
    f.bind(py).call1((a.to_py(py)?,))
}

pub fn call2<'py>(py: Python<'py>, f: &Py<PyAny>, a: &Value, b: &Value) -> PyResult<Bound<'py, PyAny>> {
    f.bind(py).call1((a.to_py(py)?, b.to_py(py)?))
}

const EXACT: i64 = 1 << 53;

fn py_float_mod(x: f64, y: f64) -> f64 {
    let mut m = x % y;
    if m != 0.0 {
        if (y < 0.0) != (m < 0.0) {
            m += y;
        }
    } else {
        m = 0.0f64.copysign(y);
    }
    m
}

/// `x op y` on two native numbers as CPython computes it: `Some(Some(r))` the result,
/// `Some(None)` NULL (division or modulo by zero), `None` when CPython's answer needs Python
/// (an int result beyond 64 bits, an inexact int division).
#[inline(always)]
pub(crate) fn arith_num(op: ArOp, x: Num, y: Num) -> Option<Option<Num>> {
    match (x, y) {
        (Num::I(i), Num::I(j)) => match op {
            ArOp::Add => i.checked_add(j).map(|r| Some(Num::I(r))),
            ArOp::Sub => i.checked_sub(j).map(|r| Some(Num::I(r))),
            ArOp::Mul => i.checked_mul(j).map(|r| Some(Num::I(r))),
            ArOp::Div if j == 0 => Some(None),
            ArOp::Div if (-EXACT..=EXACT).contains(&i) && (-EXACT..=EXACT).contains(&j) => {
                Some(Some(Num::F(i as f64 / j as f64)))
            }
            ArOp::Div => None,
            ArOp::Mod if j == 0 => Some(None),
            ArOp::Mod => {
                let mut r = i.wrapping_rem(j);
                if r != 0 && ((r < 0) != (j < 0)) {
                    r += j;
                }
                Some(Some(Num::I(r)))
            }
        },
        _ => {
            let (x, y) = (as_f64(x), as_f64(y));
            Some(match op {
                ArOp::Add => Some(Num::F(x + y)),
                ArOp::Sub => Some(Num::F(x - y)),
                ArOp::Mul => Some(Num::F(x * y)),
                ArOp::Div | ArOp::Mod if y == 0.0 => None,
                ArOp::Div => Some(Num::F(x / y)),
                ArOp::Mod => Some(Num::F(py_float_mod(x, y))),
            })
        }
    }
}

/// `a op b` for non-NULL operands, NULL on TypeError/ZeroDivisionError/OverflowError.
pub fn arith(py: Python<'_>, ops: &PyOps, op: ArOp, a: &Value, b: &Value) -> PyResult<Value> {
    if let (Some(x), Some(y)) = (num(a), num(b)) {
        if let Some(r) = arith_num(op, x, y) {
            return Ok(r.map_or(Value::Null, Num::value));
        }
    }
    if not_arithmetic(py, op, a, b) {
        return Ok(Value::Null);
    }
    soft(py, call2(py, op_fn(ops, op), a, b))
}

/// Python's `*` on a string or list (repetition) and `%` on a string (formatting) are not
/// arithmetic: an event's number would decide how much memory they take. NULL, as `cep.expr`'s
/// `_mul` and `_mod` make them.
fn not_arithmetic(py: Python<'_>, op: ArOp, a: &Value, b: &Value) -> bool {
    let text = |v: &Value| match v {
        Value::Str(_) => true,
        Value::Py(o) => {
            let o = o.bind(py);
            o.is_instance_of::<PyString>() || o.is_instance_of::<PyBytes>() || o.is_instance_of::<PyByteArray>()
        }
        _ => false,
    };
    let seq = |v: &Value| {
        text(v) || matches!(v, Value::Py(o) if o.bind(py).is_instance_of::<PyList>() || o.bind(py).is_instance_of::<PyTuple>())
    };
    match op {
        ArOp::Mul => seq(a) || seq(b),
        ArOp::Mod => text(a),
        _ => false,
    }
}

fn op_fn(ops: &PyOps, op: ArOp) -> &Py<PyAny> {
    match op {
        ArOp::Add => &ops.add,
        ArOp::Sub => &ops.sub,
        ArOp::Mul => &ops.mul,
        ArOp::Div => &ops.truediv,
        ArOp::Mod => &ops.mod_,
    }
}

fn cmp_fn(ops: &PyOps, op: CmpOp) -> &Py<PyAny> {
    match op {
        CmpOp::Eq => &ops.eq,
        CmpOp::Ne => &ops.ne,
        CmpOp::Lt => &ops.lt,
        CmpOp::Le => &ops.le,
        CmpOp::Gt => &ops.gt,
        CmpOp::Ge => &ops.ge,
    }
}

/// Exact comparison of an int with a float (None when the float is NaN), as CPython does.
fn cmp_int_float(i: i64, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    if (-EXACT..=EXACT).contains(&i) {
        return (i as f64).partial_cmp(&f);
    }
    const TWO63: f64 = 9_223_372_036_854_775_808.0;
    if f >= TWO63 {
        return Some(Ordering::Less);
    }
    if f < -TWO63 {
        return Some(Ordering::Greater);
    }
    let t = f.trunc();
    let ti = t as i64; // exact: |t| < 2^63 and t is integral
    match i.cmp(&ti) {
        Ordering::Equal => 0.0f64.partial_cmp(&(f - t)),
        o => Some(o),
    }
}

#[inline(always)]
pub(crate) fn num_cmp(x: Num, y: Num) -> Option<Ordering> {
    match (x, y) {
        (Num::I(i), Num::I(j)) => Some(i.cmp(&j)),
        (Num::F(a), Num::F(b)) => a.partial_cmp(&b),
        (Num::I(i), Num::F(f)) => cmp_int_float(i, f),
        (Num::F(f), Num::I(i)) => cmp_int_float(i, f).map(Ordering::reverse),
    }
}

#[inline(always)]
pub(crate) fn holds(op: CmpOp, o: Option<Ordering>) -> bool {
    match o {
        None => op == CmpOp::Ne,
        Some(o) => match op {
            CmpOp::Eq => o == Ordering::Equal,
            CmpOp::Ne => o != Ordering::Equal,
            CmpOp::Lt => o == Ordering::Less,
            CmpOp::Le => o != Ordering::Greater,
            CmpOp::Gt => o == Ordering::Greater,
            CmpOp::Ge => o != Ordering::Less,
        },
    }
}

/// `bool(a op b)` for non-NULL operands; NULL on TypeError.
pub fn compare(py: Python<'_>, ops: &PyOps, op: CmpOp, a: &Value, b: &Value) -> PyResult<Value> {
    match (a, b) {
        (Value::Py(_), _) | (_, Value::Py(_)) => {
            match soft_type(py, call2(py, cmp_fn(ops, op), a, b))? {
                None => Ok(Value::Null),
                Some(r) => Ok(Value::Bool(r.is_truthy()?)),
            }
        }
        // `=` / `<>` on the `Arc`s: for a type that is `Eq`, std compares the pointers first, so
        // a batch column's shared value (`arrow::Col::interned`) is equal without reading it.
        (Value::Str(x), Value::Str(y)) => Ok(Value::Bool(match op {
            CmpOp::Eq => x == y,
            CmpOp::Ne => x != y,
            _ => holds(op, Some(x.as_ref().cmp(y.as_ref()))),
        })),
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => Ok(Value::Bool(holds(op, num_cmp(x, y)))),
            _ => Ok(match op {
                CmpOp::Eq => Value::Bool(false),
                CmpOp::Ne => Value::Bool(true),
                _ => Value::Null,
            }),
        },
    }
}

/// Python `a == b` (truthiness), for IN lists.
pub fn py_eq(py: Python<'_>, ops: &PyOps, a: &Value, b: &Value) -> PyResult<bool> {
    match (a, b) {
        (Value::Null, Value::Null) => Ok(true),
        (Value::Null, _) | (_, Value::Null) => match (a, b) {
            (Value::Py(_), _) | (_, Value::Py(_)) => call2(py, &ops.eq, a, b)?.is_truthy(),
            _ => Ok(false),
        },
        _ => match compare(py, ops, CmpOp::Eq, a, b)? {
            Value::Bool(t) => Ok(t),
            _ => call2(py, &ops.eq, a, b)?.is_truthy(),
        },
    }
}

/// `a < b` for MIN/MAX: Some(bool) or None on TypeError.
pub fn less(py: Python<'_>, ops: &PyOps, a: &Value, b: &Value, greater: bool) -> PyResult<Option<bool>> {
    let op = if greater { CmpOp::Gt } else { CmpOp::Lt };
    match compare(py, ops, op, a, b)? {
        Value::Bool(t) => Ok(Some(t)),
        _ => Ok(None),
    }
}

pub fn neg(py: Python<'_>, ops: &PyOps, v: &Value) -> PyResult<Value> {
    Ok(match v {
        Value::Null | Value::Bool(_) | Value::Str(_) => Value::Null,
        Value::Int(i) => match i.checked_neg() {
            Some(n) => Value::Int(n),
            None => soft(py, call1(py, &ops.neg, v))?,
        },
        Value::Float(f) => Value::Float(-f),
        Value::Py(o) => {
            if o.bind(py).downcast::<PyBool>().is_ok() {
                Value::Null
            } else {
                soft_only_type(py, call1(py, &ops.neg, v))?
            }
        }
    })
}

fn soft_only_type(py: Python<'_>, r: PyResult<Bound<'_, PyAny>>) -> PyResult<Value> {
    Ok(match soft_type(py, r)? {
        None => Value::Null,
        Some(v) => Value::from_py(&v),
    })
}

/// One-argument functions (`cep.expr.Func`): TypeError, ValueError, OverflowError and OSError
/// become NULL.
fn soft_func(py: Python<'_>, r: PyResult<Bound<'_, PyAny>>) -> PyResult<Value> {
    match r {
        Ok(v) => Ok(Value::from_py(&v)),
        Err(e)
            if e.is_instance_of::<PyTypeError>(py)
                || e.is_instance_of::<PyValueError>(py)
                || e.is_instance_of::<PyOverflowError>(py)
                || e.is_instance_of::<PyOSError>(py) =>
        {
            Ok(Value::Null)
        }
        Err(e) => Err(e),
    }
}

pub fn abs(py: Python<'_>, ops: &PyOps, v: &Value) -> PyResult<Value> {
    Ok(match v {
        Value::Null => Value::Null,
        Value::Bool(b) => Value::Int(*b as i64),
        Value::Int(i) => match i.checked_abs() {
            Some(n) => Value::Int(n),
            None => soft_func(py, call1(py, &ops.abs, v))?,
        },
        Value::Float(f) => Value::Float(f.abs()),
        Value::Str(_) => Value::Null,
        Value::Py(_) => soft_func(py, call1(py, &ops.abs, v))?,
    })
}

pub fn case(py: Python<'_>, ops: &PyOps, v: &Value, upper: bool) -> PyResult<Value> {
    Ok(match v {
        Value::Str(s) if s.is_ascii() => Value::Str(Arc::from(if upper {
            s.to_ascii_uppercase()
        } else {
            s.to_ascii_lowercase()
        })),
        Value::Str(_) | Value::Py(_) => {
            let f = if upper { &ops.upper } else { &ops.lower };
            soft_func(py, call1(py, f, v))?
        }
        _ => Value::Null,
    })
}

pub fn length(py: Python<'_>, ops: &PyOps, v: &Value) -> PyResult<Value> {
    Ok(match v {
        Value::Str(s) => Value::Int(s.chars().count() as i64),
        Value::Py(_) => soft_func(py, call1(py, &ops.len, v))?,
        _ => Value::Null,
    })
}

/// `v in frozenset(consts)`: None on TypeError (unhashable v).
pub fn in_set(py: Python<'_>, ops: &PyOps, set: &Py<PyAny>, v: &Value) -> PyResult<Option<bool>> {
    match soft_type(py, ops.contains.bind(py).call1((set.clone_ref(py), v.to_py(py)?)))? {
        None => Ok(None),
        Some(r) => Ok(Some(r.is_truthy()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_mod_follows_python() {
        assert_eq!(py_float_mod(-1.0, 3.0), 2.0);
        assert_eq!(py_float_mod(1.0, -3.0), -2.0);
        assert!(py_float_mod(3.0, -3.0).is_sign_negative());
    }

    #[test]
    fn int_float_comparison_is_exact() {
        let big = (1i64 << 53) + 1;
        assert_eq!(cmp_int_float(big, (1u64 << 53) as f64), Some(Ordering::Greater));
        assert_eq!(cmp_int_float(i64::MAX, 9_223_372_036_854_775_808.0), Some(Ordering::Less));
        assert_eq!(cmp_int_float(3, 2.5), Some(Ordering::Greater));
        assert_eq!(cmp_int_float(-3, -2.5), Some(Ordering::Less));
        assert_eq!(cmp_int_float(1, f64::NAN), None);
    }

    #[test]
    fn native_arithmetic_follows_python() {
        use Num::{F, I};
        // Results: int stays int, `/` is a float, a float operand makes a float.
        assert_eq!(arith_num(ArOp::Add, I(2), I(3)), Some(Some(I(5))));
        assert_eq!(arith_num(ArOp::Div, I(7), I(2)), Some(Some(F(3.5))));
        assert_eq!(arith_num(ArOp::Mul, I(3), F(0.5)), Some(Some(F(1.5))));
        assert_eq!(arith_num(ArOp::Mod, I(-7), I(3)), Some(Some(I(2))));
        assert_eq!(arith_num(ArOp::Mod, F(-1.0), I(3)), Some(Some(F(2.0))));
        // Division and modulo by zero (int or float zero): NULL.
        assert_eq!(arith_num(ArOp::Div, I(1), I(0)), Some(None));
        assert_eq!(arith_num(ArOp::Mod, I(1), I(0)), Some(None));
        assert_eq!(arith_num(ArOp::Div, F(1.0), F(-0.0)), Some(None));
        assert_eq!(arith_num(ArOp::Mod, I(1), F(0.0)), Some(None));
        // Beyond 64 bits, or an int division CPython computes exactly: Python's to answer.
        assert_eq!(arith_num(ArOp::Add, I(i64::MAX), I(1)), None);
        assert_eq!(arith_num(ArOp::Mul, I(1 << 62), I(4)), None);
        assert_eq!(arith_num(ArOp::Div, I((1 << 53) + 1), I(3)), None);
    }

    #[test]
    fn comparisons_with_nan() {
        assert!(holds(CmpOp::Ne, None));
        assert!(!holds(CmpOp::Eq, None));
        assert!(!holds(CmpOp::Le, None));
    }
}
