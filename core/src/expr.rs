//! Condition and measure expressions: built once from the exported program
//! (`cep/program.py`), evaluated with `cep.expr`'s semantics.

use std::sync::Arc;

use once_cell::race::OnceBox;
use triomphe::ThinArc;
use pyo3::prelude::*;
use pyo3::types::{PyFrozenSet, PyList};
use regex::Regex;

use crate::program::bad;
use crate::value::{self, ArOp, CmpOp, Num, PyOps, Value};

/// One event as the matcher keeps it: its time, its sequence number, its row (column table and
/// values) or Python object. A handle to one reference-counted block (`triomphe::ThinArc`, a
/// thin pointer: 8 bytes in a `Cap` or an `Item`): the count, the header (`EvHead`), the
/// values' length and the row's values themselves, inline (a fraud event's 5 values: 184 bytes,
/// one 192-byte block, three cache lines; a Python-object event: 64). Until session 19 an Arrow
/// event was three blocks (`Arc<Ev>` 64, `Arc<Row>` 48, the values 128) made by three
/// allocations (docs/native-core.md, "Many keys: one block per event (session 19)"). An event
/// read from an Arrow batch has no Python object until a result or the serialised state needs
/// one: `obj()` / `seq_obj()` build them then, behind one pointer (`lazy`), made on first use.
#[derive(Clone)]
pub struct Ev(ThinArc<EvHead, Value>);

/// An event's fixed part (`Ev` derefs to it).
pub struct EvHead {
    pub ts: i64,
    pub seqi: i64,
    /// The row's column table (None: a Python-object event, no values).
    cols: Option<Arc<Cols>>,
    /// For a row: where each field of the reading rules' table is among the row's columns
    /// (`u32::MAX`: absent), shared by the rows of one column table. Fields are then read from
    /// the row in place and `vals` stays empty.
    pub pidx: Option<Arc<[u32]>>,
    /// One pointer (a `OnceLock<Box<Lazy>>` takes two words): set once, by the first reader
    /// to store its box (a racing one drops its own).
    lazy: OnceBox<Lazy>,
}

impl std::ops::Deref for Ev {
    type Target = EvHead;
    #[inline(always)]
    fn deref(&self) -> &EvHead {
        &self.0.header.header
    }
}

/// The parts of an `Ev` an Arrow event rarely needs (each set once, on first use).
#[derive(Default)]
struct Lazy {
    obj: std::sync::OnceLock<Py<PyAny>>,
    seq: std::sync::OnceLock<Py<PyAny>>,
    vals: std::sync::OnceLock<Vec<Value>>,
}

/// The column names of an Arrow batch (shared by its rows).
pub struct Cols {
    pub names: Vec<String>,
    pub py_names: Vec<Py<pyo3::types::PyString>>,
}

/// A row not (yet) in an event: a JSON event parsed, a buffered event read back from state.
/// Its values move into the event's block when the event is made (`Ev::from_row`).
#[derive(Clone)]
pub struct Row {
    pub cols: Arc<Cols>,
    pub vals: Vec<Value>,
}

/// A row's column table and values, borrowed (from a `Row` or an `Ev`).
#[derive(Clone, Copy)]
pub struct RowRef<'a> {
    pub cols: &'a Arc<Cols>,
    pub vals: &'a [Value],
}

impl Row {
    pub fn view(&self) -> RowRef<'_> {
        RowRef { cols: &self.cols, vals: &self.vals }
    }
}

impl RowRef<'_> {
    pub fn get(&self, name: &str) -> Value {
        match self.cols.names.iter().position(|n| n == name) {
            Some(i) => self.vals[i].clone(),
            None => Value::Null,
        }
    }

    /// The event as a dict, columns in batch order (what pyarrow's `to_pylist` gives).
    pub fn to_dict(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let d = pyo3::types::PyDict::new(py);
        for (n, v) in self.cols.py_names.iter().zip(self.vals) {
            d.set_item(n.bind(py), v.to_py(py)?)?;
        }
        Ok(d.into_any().unbind())
    }
}

impl Ev {
    fn make<I: ExactSizeIterator<Item = Value>>(head: EvHead, vals: I) -> Ev {
        Ev(ThinArc::from_header_and_iter(head, vals))
    }

    pub fn from_py(obj: Py<PyAny>, seq: Py<PyAny>, ts: i64) -> Ev {
        let ev = Ev::make(EvHead { ts, seqi: 0, cols: None, pidx: None, lazy: OnceBox::new() }, std::iter::empty());
        let l = ev.lazy.get_or_init(Box::default);
        let _ = l.obj.set(obj);
        let _ = l.seq.set(seq);
        ev
    }

    /// A row whose fields are found through `pidx` (the projection of its column table on the
    /// reading rules' field table); `vals` (the row's values, in its table's order) are moved
    /// into the event's block.
    pub fn from_vals<I: ExactSizeIterator<Item = Value>>(
        cols: Arc<Cols>,
        vals: I,
        seq: Option<Py<PyAny>>,
        seqi: i64,
        ts: i64,
        pidx: Arc<[u32]>,
    ) -> Ev {
        let ev = Ev::make(EvHead { ts, seqi, cols: Some(cols), pidx: Some(pidx), lazy: OnceBox::new() }, vals);
        if let Some(s) = seq {
            let _ = ev.lazy.get_or_init(Box::default).seq.set(s);
        }
        ev
    }

    /// `from_vals` of a row (its values moved).
    pub fn from_row(row: Row, seq: Option<Py<PyAny>>, seqi: i64, ts: i64, pidx: Arc<[u32]>) -> Ev {
        Ev::from_vals(row.cols, row.vals.into_iter(), seq, seqi, ts, pidx)
    }

    /// A row read back from serialised state: its projection on a rule's fields is made when
    /// the rule first reads it (`Cx::vals`).
    pub fn from_row_lazy(row: Row, seqi: i64, ts: i64) -> Ev {
        Ev::make(EvHead { ts, seqi, cols: Some(row.cols), pidx: None, lazy: OnceBox::new() }, row.vals.into_iter())
    }

    /// The event's row (None for a Python-object event).
    #[inline]
    pub fn row(&self) -> Option<RowRef<'_>> {
        self.cols.as_ref().map(|cols| RowRef { cols, vals: &self.0.slice })
    }

    /// The row's values, in its table's order (empty for a Python-object event).
    #[inline(always)]
    pub fn row_vals(&self) -> &[Value] {
        &self.0.slice
    }

    /// The start of the event's block (its count, then `EvHead`, then the values): the
    /// event's identity (`ptr_eq`) and what a prefetch asks for.
    #[inline(always)]
    pub fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr().cast()
    }

    #[inline(always)]
    pub fn ptr_eq(a: &Ev, b: &Ev) -> bool {
        std::ptr::eq(a.as_ptr(), b.as_ptr())
    }

    pub fn obj(&self, py: Python<'_>) -> PyResult<&Py<PyAny>> {
        let l = self.lazy.get_or_init(Box::default);
        if let Some(o) = l.obj.get() {
            return Ok(o);
        }
        let built = match self.row() {
            Some(r) => r.to_dict(py)?,
            None => py.None(),
        };
        let _ = l.obj.set(built);
        Ok(l.obj.get().expect("set above"))
    }

    pub fn seq_obj(&self, py: Python<'_>) -> PyResult<&Py<PyAny>> {
        let l = self.lazy.get_or_init(Box::default);
        if let Some(o) = l.seq.get() {
            return Ok(o);
        }
        let _ = l.seq.set(self.seqi.into_pyobject(py)?.into_any().unbind());
        Ok(l.seq.get().expect("set above"))
    }

    /// The values of the reading rule's fields, once set (`Cx::vals`).
    pub fn vals(&self) -> Option<&Vec<Value>> {
        self.lazy.get().and_then(|l| l.vals.get())
    }

    /// Set the values of the reading rule's fields (kept if already set).
    pub fn set_vals(&self, v: Vec<Value>) {
        let _ = self.lazy.get_or_init(Box::default).vals.set(v);
    }
}

#[derive(Clone)]
pub struct Cap {
    pub var: u32,
    pub row: i64,
    pub ev: Ev,
}

/// A partial match's captures, with the running values of its rule's condition aggregates
/// (`AggSpec`, one `Acc` per slot) folded in as captures are added (`Core::fold`), so that a
/// condition reads `AVG(a.x)` in constant time instead of going over every capture.
#[derive(Clone, Default)]
pub struct CapVec {
    pub v: Vec<Cap>,
    /// One per slot of the rule's `aggs`, up to date with `v`; empty when not maintained (a rule
    /// without condition aggregates, or captures read back from serialised state until their
    /// next capture): the aggregates are then computed over `v` as before.
    pub acc: Vec<Acc>,
}

impl std::ops::Deref for CapVec {
    type Target = [Cap];
    #[inline]
    fn deref(&self) -> &[Cap] {
        &self.v
    }
}

impl From<Vec<Cap>> for CapVec {
    fn from(v: Vec<Cap>) -> Self {
        CapVec { v, acc: Vec::new() }
    }
}

/// No captures (a row expression is evaluated on one event alone).
pub static NO_CAPS: CapVec = CapVec { v: Vec::new(), acc: Vec::new() };

/// A partial match's captures, shared by its entries (and timeout candidates). A
/// `triomphe::Arc`: one count, no weak count (no `Weak` of captures is ever made), so the
/// uniqueness test of a grow in place (`Caps::get_mut`) is a plain load, not std `Arc`'s
/// compare-exchange on the weak count (docs/native-core.md, "Trading: ... (session 21)").
pub type Caps = triomphe::Arc<CapVec>;

/// An aggregate of a rule's conditions, kept per partial match: `func` over `row` evaluated on
/// the events captured for `var` (every event when None); `row` None is `COUNT(var.*)`.
pub struct AggSpec {
    pub func: AggF,
    pub var: Option<u32>,
    pub row: Option<Expr>,
}

/// The fold of an aggregate's non-NULL values so far: none yet, the running sum (SUM, AVG) or
/// extreme (MIN, MAX), or NULL for good (a step failed: `sum()` / `min()` raised TypeError).
#[derive(Clone, Default)]
pub enum Fold {
    #[default]
    Empty,
    Val(Value),
    Null,
}

/// One aggregate's running state over a partial match's captures.
#[derive(Clone, Default)]
pub struct Acc {
    /// The values counted: non-NULL row values, or captures for `COUNT(var.*)`.
    pub n: i64,
    pub fold: Fold,
    /// A row or a fold step raised a Python exception: the aggregate is recomputed over the
    /// captures when read (`Expr::agg`), so the exception is raised when and as Python raises it.
    pub broken: bool,
}

/// The value of an aggregate's row expression for the event being fed, per slot, shared by all
/// the partial matches that fold or read it (`None` in the cell: the row raised).
pub type RowMemo = std::cell::OnceCell<Option<Value>>;

#[derive(Clone, Copy)]
pub enum AggF {
    Sum,
    Avg,
    Count,
    Min,
    Max,
}

#[derive(Clone, Copy)]
pub enum StrOpK {
    Contains,
    Starts,
    Ends,
    Matches,
}

#[derive(Clone, Copy)]
pub enum FuncK {
    Abs,
    Lower,
    Upper,
    Length,
    Coalesce,
}

pub enum Expr {
    Const(Value),
    Field(usize),
    /// A nested JSON field: field `i`, then each key in turn (NULL when a level is missing or
    /// not an object); `cep.expr.Path`.
    Path(usize, Vec<Py<pyo3::types::PyString>>),
    VarRow { var: u32, first: bool, row: Box<Expr>, cur: bool },
    Prev { row: Box<Expr>, back: usize },
    Agg { func: AggF, var: Option<u32>, row: Option<Box<Expr>>, cur: bool },
    /// A condition's aggregate, kept per partial match: `Cx::aggs[slot]` (`Program::aggs`).
    AggSlot { slot: u32, cur: bool },
    /// A part of a condition that reads only the tested event (`ask - bid` in
    /// `ask - bid > 3 * AVG(calm.ask - calm.bid)`): computed once per event for every partial
    /// match that tests it (`Cx::rows[slot]`).
    Local { slot: u32, e: Box<Expr> },
    Neg(Box<Expr>),
    Arith(ArOp, Box<Expr>, Box<Expr>),
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    IsNull(Box<Expr>, bool),
    InConst { e: Box<Expr>, items: Vec<Value>, negated: bool, set: Py<PyAny> },
    InList { e: Box<Expr>, items: Vec<Expr>, negated: bool },
    Str { op: StrOpK, e: Box<Expr>, arg: Box<Expr>, negated: bool, regex: Option<Regex> },
    Func(FuncK, Vec<Expr>),
}

/// Calls `$f` on each direct sub-expression of `$e` (a `&Expr` or a `&mut Expr`), in order:
/// the one walk over an expression's children that `for_each_child` and
/// `for_each_child_mut` share.
macro_rules! each_child {
    ($e:expr, $f:expr) => {
        match $e {
            Expr::Const(_) | Expr::Field(_) | Expr::Path(..) | Expr::AggSlot { .. } => {}
            Expr::VarRow { row, .. } | Expr::Prev { row, .. } => $f(row),
            Expr::Agg { row, .. } => {
                if let Some(r) = row {
                    $f(r)
                }
            }
            Expr::Neg(x) | Expr::Not(x) | Expr::IsNull(x, _) | Expr::InConst { e: x, .. } | Expr::Local { e: x, .. } => $f(x),
            Expr::Arith(_, l, r) | Expr::Cmp(_, l, r) | Expr::And(l, r) | Expr::Or(l, r) => {
                $f(l);
                $f(r);
            }
            Expr::InList { e, items, .. } => {
                $f(e);
                for x in items {
                    $f(x);
                }
            }
            Expr::Str { e, arg, .. } => {
                $f(e);
                $f(arg);
            }
            Expr::Func(_, args) => {
                for x in args {
                    $f(x);
                }
            }
        }
    };
}

impl Expr {
    /// Calls `f` on each direct sub-expression, in order.
    pub fn for_each_child(&self, f: &mut dyn FnMut(&Expr)) {
        each_child!(self, f)
    }

    /// Calls `f` on each direct sub-expression, in order, mutably.
    pub fn for_each_child_mut(&mut self, f: &mut dyn FnMut(&mut Expr)) {
        each_child!(self, f)
    }

    /// Renumber the fields this expression reads (`map[old] = new`): the engine puts every rule
    /// of a group on one field table, so one projection of an event serves all of them.
    pub fn remap_fields(&mut self, map: &[usize]) {
        match self {
            Expr::Field(i) | Expr::Path(i, _) => *i = map[*i],
            _ => self.for_each_child_mut(&mut |x| x.remap_fields(map)),
        }
    }

    /// Moves every aggregate of this (condition) expression into `aggs` and leaves an
    /// `AggSlot` naming it in its place.
    pub fn slot_aggs(&mut self, aggs: &mut Vec<AggSpec>) {
        match self {
            Expr::Agg { .. } => {
                let Expr::Agg { func, var, row, cur } = std::mem::replace(self, Expr::Const(Value::Null)) else {
                    unreachable!()
                };
                aggs.push(AggSpec { func, var, row: row.map(|r| *r) });
                *self = Expr::AggSlot { slot: aggs.len() as u32 - 1, cur };
            }
            // A row expression is evaluated on one event alone: no aggregate inside it reads
            // captures, so it is left as it is.
            Expr::VarRow { .. } | Expr::Prev { .. } | Expr::Local { .. } => {}
            _ => self.for_each_child_mut(&mut |x| x.slot_aggs(aggs)),
        }
    }

    /// Whether this expression reads nothing but the tested event (no capture, no aggregate).
    fn reads_event_only(&self) -> bool {
        match self {
            Expr::VarRow { .. } | Expr::Prev { .. } | Expr::Agg { .. } | Expr::AggSlot { .. } | Expr::Local { .. } => false,
            _ => {
                let mut only = true;
                self.for_each_child(&mut |x| only &= x.reads_event_only());
                only
            }
        }
    }

    /// In a condition that reads captures, wraps each largest part that reads only the tested
    /// event (and is more than a constant or a field) in `Local`, numbering them from `*next`.
    pub fn memo_locals(&mut self, next: &mut u32) {
        if self.reads_event_only() {
            if !matches!(self, Expr::Const(_) | Expr::Field(_)) {
                let e = std::mem::replace(self, Expr::Const(Value::Null));
                *self = Expr::Local { slot: *next, e: Box::new(e) };
                *next += 1;
            }
            return;
        }
        match self {
            Expr::VarRow { .. } | Expr::Prev { .. } | Expr::Agg { .. } | Expr::Local { .. } => {}
            _ => self.for_each_child_mut(&mut |x| x.memo_locals(next)),
        }
    }
}

fn kid(py: Python<'_>, node: &Bound<'_, PyList>, i: usize, nfields: usize) -> PyResult<Box<Expr>> {
    Ok(Box::new(build(py, &node.get_item(i)?, nfields)?))
}

/// Build an expression from its exported form.
pub fn build(py: Python<'_>, obj: &Bound<'_, PyAny>, nfields: usize) -> PyResult<Expr> {
    let node = obj.downcast::<PyList>().map_err(|_| bad("expression is not a list"))?;
    let tag: String = node.get_item(0)?.extract()?;
    let s = |i: usize| -> PyResult<String> { node.get_item(i)?.extract::<String>() };
    Ok(match tag.as_str() {
        "const" => {
            let v = Value::from_py(&node.get_item(1)?);
            if matches!(v, Value::Py(_)) {
                return Err(bad("constant of an unsupported type"));
            }
            Expr::Const(v)
        }
        "field" => {
            let i: usize = node.get_item(1)?.extract()?;
            if i >= nfields {
                return Err(bad("field index out of range"));
            }
            Expr::Field(i)
        }
        "path" => {
            let i: usize = node.get_item(1)?.extract()?;
            if i >= nfields {
                return Err(bad("field index out of range"));
            }
            let keys: Vec<String> = node.get_item(2)?.extract()?;
            if keys.is_empty() {
                return Err(bad("path: no keys"));
            }
            Expr::Path(i, keys.iter().map(|k| pyo3::types::PyString::intern(py, k).unbind()).collect())
        }
        "var_row" => Expr::VarRow {
            var: node.get_item(1)?.extract()?,
            first: match s(2)?.as_str() {
                "FIRST" => true,
                "LAST" => false,
                _ => return Err(bad("var_row: FIRST or LAST expected")),
            },
            row: kid(py, node, 3, nfields)?,
            cur: node.get_item(4)?.extract()?,
        },
        "prev" => {
            let n: i64 = node.get_item(2)?.extract()?;
            let off: i64 = node.get_item(3)?.extract()?;
            if n + off < 1 {
                return Err(bad("prev: offset below 1"));
            }
            Expr::Prev { row: kid(py, node, 1, nfields)?, back: (n + off) as usize }
        }
        "agg" => {
            let func = match s(1)?.as_str() {
                "SUM" => AggF::Sum,
                "AVG" => AggF::Avg,
                "COUNT" => AggF::Count,
                "MIN" => AggF::Min,
                "MAX" => AggF::Max,
                f => return Err(bad(&format!("unknown aggregate {f}"))),
            };
            let var: i64 = node.get_item(2)?.extract()?;
            let row_obj = node.get_item(3)?;
            let row = if row_obj.is_none() { None } else { Some(Box::new(build(py, &row_obj, nfields)?)) };
            if row.is_none() && !matches!(func, AggF::Count) {
                return Err(bad("aggregate over whole events"));
            }
            Expr::Agg { func, var: if var < 0 { None } else { Some(var as u32) }, row, cur: node.get_item(4)?.extract()? }
        }
        "neg" => Expr::Neg(kid(py, node, 1, nfields)?),
        "not" => Expr::Not(kid(py, node, 1, nfields)?),
        "and" => Expr::And(kid(py, node, 1, nfields)?, kid(py, node, 2, nfields)?),
        "or" => Expr::Or(kid(py, node, 1, nfields)?, kid(py, node, 2, nfields)?),
        "is_null" => Expr::IsNull(kid(py, node, 1, nfields)?, node.get_item(2)?.extract()?),
        "arith" => {
            let op = match s(1)?.as_str() {
                "+" => ArOp::Add,
                "-" => ArOp::Sub,
                "*" => ArOp::Mul,
                "/" => ArOp::Div,
                "%" => ArOp::Mod,
                o => return Err(bad(&format!("unknown operator {o}"))),
            };
            Expr::Arith(op, kid(py, node, 2, nfields)?, kid(py, node, 3, nfields)?)
        }
        "cmp" => {
            let op = match s(1)?.as_str() {
                "=" => CmpOp::Eq,
                "!=" => CmpOp::Ne,
                "<" => CmpOp::Lt,
                "<=" => CmpOp::Le,
                ">" => CmpOp::Gt,
                ">=" => CmpOp::Ge,
                o => return Err(bad(&format!("unknown comparison {o}"))),
            };
            Expr::Cmp(op, kid(py, node, 2, nfields)?, kid(py, node, 3, nfields)?)
        }
        "in" => {
            let e = kid(py, node, 1, nfields)?;
            let negated: bool = node.get_item(3)?.extract()?;
            let all_const: bool = node.get_item(4)?.extract()?;
            let list = node.get_item(2)?;
            let list = list.downcast::<PyList>().map_err(|_| bad("in: list expected"))?;
            let mut items = Vec::new();
            for it in list.iter() {
                items.push(build(py, &it, nfields)?);
            }
            if all_const {
                let mut values = Vec::new();
                let mut objs = Vec::new();
                for it in &items {
                    match it {
                        Expr::Const(v) if !v.is_null() => {
                            objs.push(v.to_py(py)?);
                            values.push(v.clone());
                        }
                        _ => return Err(bad("in: constants expected")),
                    }
                }
                let set = PyFrozenSet::new(py, &objs)?.into_any().unbind();
                Expr::InConst { e, items: values, negated, set }
            } else {
                Expr::InList { e, items, negated }
            }
        }
        "str" => {
            let op = match s(1)?.as_str() {
                "CONTAINS" => StrOpK::Contains,
                "STARTS WITH" => StrOpK::Starts,
                "ENDS WITH" => StrOpK::Ends,
                "MATCHES" => StrOpK::Matches,
                o => return Err(bad(&format!("unknown string operator {o}"))),
            };
            let arg = kid(py, node, 3, nfields)?;
            let regex = if let StrOpK::Matches = op {
                match arg.as_ref() {
                    Expr::Const(Value::Str(p)) => Some(
                        Regex::new(p).map_err(|e| bad(&format!("regex {p:?}: {e}")))?,
                    ),
                    _ => return Err(bad("MATCHES needs a literal pattern")),
                }
            } else {
                None
            };
            Expr::Str { op, e: kid(py, node, 2, nfields)?, arg, negated: node.get_item(4)?.extract()?, regex }
        }
        "func" => {
            let f = match s(1)?.as_str() {
                "ABS" => FuncK::Abs,
                "LOWER" => FuncK::Lower,
                "UPPER" => FuncK::Upper,
                "LENGTH" => FuncK::Length,
                "COALESCE" => FuncK::Coalesce,
                o => return Err(bad(&format!("unknown function {o}"))),
            };
            let list = node.get_item(2)?;
            let list = list.downcast::<PyList>().map_err(|_| bad("func: list expected"))?;
            let mut args = Vec::new();
            for it in list.iter() {
                args.push(build(py, &it, nfields)?);
            }
            if args.is_empty() || (!matches!(f, FuncK::Coalesce) && args.len() != 1) {
                return Err(bad("wrong number of function arguments"));
            }
            Expr::Func(f, args)
        }
        t => return Err(bad(&format!("unknown expression tag {t:?}"))),
    })
}

/// What evaluation needs besides the expression: Python, its operators, the field names.
pub struct Cx<'a, 'py> {
    pub py: Python<'py>,
    pub ops: &'a PyOps,
    pub fields: &'a [Py<pyo3::types::PyString>],
    /// The rule's condition aggregates (`Expr::AggSlot`).
    pub aggs: &'a [AggSpec],
    /// Per slot, its row's value for the event being fed (empty: not memoised).
    pub rows: &'a [RowMemo],
}

impl<'a> Cx<'a, '_> {
    /// Field `i` (of the field table) of event `ev`.
    #[inline]
    pub fn field(&self, ev: &Ev, i: usize) -> PyResult<Value> {
        Ok(self.field_ref(ev, i)?.clone())
    }

    /// Field `i` of event `ev`, borrowed: read in place from a row projected on the field
    /// table (`Ev::pidx`), else from the event's values (`vals`).
    #[inline]
    pub fn field_ref<'e>(&self, ev: &'e Ev, i: usize) -> PyResult<&'e Value> {
        if let Some(p) = &ev.pidx {
            return Ok(match p[i] {
                u32::MAX => &NULL,
                c => &ev.row_vals()[c as usize],
            });
        }
        Ok(&self.vals(ev)?[i])
    }

    /// The value of row expression `x` (memo slot `slot`) for the event `e` being fed, computed
    /// on the first read and shared by every partial match that reads it: `Some(None)` when it
    /// raises, None when this evaluation keeps no memo (the caller evaluates `x` itself).
    #[inline]
    fn memo(&self, slot: usize, x: &Expr, e: &Ev) -> Option<&'a Option<Value>> {
        Some(self.rows.get(slot)?.get_or_init(|| x.eval(self, e, &NO_CAPS).ok()))
    }

    pub fn vals<'e>(&self, ev: &'e Ev) -> PyResult<&'e [Value]> {
        if let Some(v) = ev.vals() {
            return Ok(v);
        }
        let v = match ev.row() {
            Some(row) => {
                let mut v = Vec::with_capacity(self.fields.len());
                for f in self.fields {
                    v.push(row.get(f.bind(self.py).to_str()?));
                }
                v
            }
            None => extract_fields(self.py, ev.obj(self.py)?.bind(self.py), self.fields)?,
        };
        ev.set_vals(v);
        Ok(ev.vals().map(|v| v.as_slice()).unwrap_or(&[]))
    }
}

/// `event.get(name)` for every field the rule reads.
pub fn extract_fields(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    fields: &[Py<pyo3::types::PyString>],
) -> PyResult<Vec<Value>> {
    let mut out = Vec::with_capacity(fields.len());
    if let Ok(d) = obj.downcast::<pyo3::types::PyDict>() {
        for f in fields {
            out.push(match d.get_item(f.bind(py))? {
                Some(v) => Value::from_py(&v),
                None => Value::Null,
            });
        }
    } else {
        let get = obj.getattr("get")?;
        for f in fields {
            out.push(Value::from_py(&get.call1((f.bind(py),))?));
        }
    }
    Ok(out)
}

/// An absent field (`Expr::operand`).
static NULL: Value = Value::Null;

impl Expr {
    /// `eval` for an operand of a comparison or arithmetic: a constant, a field of a row or a
    /// captured row's field is borrowed in place (no value copied, no reference count touched);
    /// anything else is evaluated.
    #[inline]
    fn operand<'a>(&'a self, cx: &Cx, e: &'a Ev, c: &'a CapVec) -> PyResult<std::borrow::Cow<'a, Value>> {
        use std::borrow::Cow;
        match self {
            Expr::Const(v) => Ok(Cow::Borrowed(v)),
            Expr::Field(i) => Ok(Cow::Borrowed(cx.field_ref(e, *i)?)),
            Expr::VarRow { var, first, row, cur } if matches!(**row, Expr::Field(_)) => match row_event(*var, *first, *cur, e, c) {
                Some(ev) => row.operand(cx, ev, &NO_CAPS),
                None => Ok(Cow::Borrowed(&NULL)),
            },
            _ => Ok(Cow::Owned(self.eval(cx, e, c)?)),
        }
    }

    /// The value of this expression when it is a native number (int, bool or float),
    /// computed without building a `Value` and without Python: the fast path of comparisons
    /// and arithmetic. `None` whenever the answer is anything else (NULL, a string, a Python
    /// object, an int beyond 64 bits, a division by zero, a row that raises) or needs a node
    /// this path does not know: `eval` then computes it as before. It never raises and never
    /// changes state (the per-event memo it fills is the one `eval` fills).
    #[inline(always)]
    pub(crate) fn num(&self, cx: &Cx, e: &Ev, c: &CapVec) -> Option<Num> {
        // The leaves in line (no call for a constant, a field, a memoised part already
        // computed for this event or an aggregate of other rows); the other nodes in `num_node`.
        match self {
            Expr::Const(v) => value::num(v),
            Expr::Field(i) => value::num(cx.field_ref(e, *i).ok()?),
            Expr::Local { slot, .. } => match cx.rows.get(*slot as usize).and_then(|m| m.get()) {
                Some(v) => value::num(v.as_ref()?),
                None => self.num_node(cx, e, c),
            },
            Expr::AggSlot { slot, cur: false } => agg_slot_num(cx, *slot as usize, false, e, c),
            _ => self.num_node(cx, e, c),
        }
    }

    /// `num` for the nodes it does not answer in line.
    #[inline(never)]
    fn num_node(&self, cx: &Cx, e: &Ev, c: &CapVec) -> Option<Num> {
        match self {
            Expr::Local { slot, e: x } => match cx.memo(*slot as usize, x, e) {
                Some(v) => value::num(v.as_ref()?),
                None => x.num(cx, e, &NO_CAPS),
            },
            Expr::VarRow { var, first, row, cur } => row.num(cx, row_event(*var, *first, *cur, e, c)?, &NO_CAPS),
            Expr::Prev { row, back } if c.len() >= *back => row.num(cx, &c[c.len() - back].ev, &NO_CAPS),
            Expr::AggSlot { slot, cur } => agg_slot_num(cx, *slot as usize, *cur, e, c),
            Expr::Arith(op, l, r) => {
                let x = l.num(cx, e, c)?;
                let y = r.num(cx, e, c)?;
                value::arith_num(*op, x, y)?
            }
            _ => None,
        }
    }

    /// Whether this condition holds (`eval(..).is_true()`): a comparison of native numbers is
    /// answered without building a `Value` (the test of every partial match).
    #[inline]
    pub fn holds(&self, cx: &Cx, e: &Ev, c: &CapVec) -> PyResult<bool> {
        if let Expr::Cmp(op, l, r) = self {
            if let Some(b) = cmp_num(*op, l, r, cx, e, c) {
                return Ok(b);
            }
            return Ok(compare(cx, *op, l, r, e, c)?.is_true());
        }
        Ok(self.eval(cx, e, c)?.is_true())
    }

    /// The value of this expression for event `e` with the match so far `c`.
    pub fn eval(&self, cx: &Cx, e: &Ev, c: &CapVec) -> PyResult<Value> {
        let py = cx.py;
        Ok(match self {
            Expr::Const(v) => v.clone(),
            Expr::Field(i) => cx.field(e, *i)?,
            Expr::Path(i, keys) => {
                // Only an object (a Python dict) has keys; every level is read in place and
                // only the leaf becomes a `Value`.
                let Value::Py(o) = cx.field(e, *i)? else {
                    return Ok(Value::Null);
                };
                let mut cur = o.bind(py).clone();
                for k in keys {
                    let Ok(d) = cur.downcast::<pyo3::types::PyDict>() else {
                        return Ok(Value::Null);
                    };
                    match d.get_item(k.bind(py))? {
                        Some(x) => cur = x,
                        None => return Ok(Value::Null),
                    }
                }
                Value::from_py(&cur)
            }
            Expr::VarRow { var, first, row, cur } => match row_event(*var, *first, *cur, e, c) {
                Some(ev) => row.eval(cx, ev, &NO_CAPS)?,
                None => Value::Null,
            },
            Expr::Prev { row, back } => {
                if c.len() >= *back {
                    row.eval(cx, &c[c.len() - back].ev, &NO_CAPS)?
                } else {
                    Value::Null
                }
            }
            Expr::Agg { func, var, row, cur } => agg(cx, *func, *var, row.as_deref(), *cur, e, c)?,
            Expr::AggSlot { slot, cur } => agg_slot(cx, *slot as usize, *cur, e, c)?,
            Expr::Local { slot, e: x } => match cx.memo(*slot as usize, x, e) {
                Some(Some(v)) => v.clone(),
                // Not memoised, or it raises: evaluated (raising as Python raises it).
                _ => x.eval(cx, e, &NO_CAPS)?,
            },
            Expr::Neg(x) => {
                let v = x.eval(cx, e, c)?;
                value::neg(py, cx.ops, &v)?
            }
            Expr::Arith(op, l, r) => {
                if let Some(x) = self.num(cx, e, c) {
                    return Ok(x.value());
                }
                binary(cx, l, r, e, c, |a, b| value::arith(py, cx.ops, *op, a, b))?
            }
            Expr::Cmp(op, l, r) => {
                if let Some(b) = cmp_num(*op, l, r, cx, e, c) {
                    return Ok(Value::Bool(b));
                }
                compare(cx, *op, l, r, e, c)?
            }
            Expr::And(l, r) => {
                let a = l.eval(cx, e, c)?;
                if a.is_false() {
                    return Ok(Value::Bool(false));
                }
                let b = r.eval(cx, e, c)?;
                if b.is_false() {
                    return Ok(Value::Bool(false));
                }
                if a.is_true() && b.is_true() {
                    Value::Bool(true)
                } else {
                    Value::Null
                }
            }
            Expr::Or(l, r) => {
                let a = l.eval(cx, e, c)?;
                if a.is_true() {
                    return Ok(Value::Bool(true));
                }
                let b = r.eval(cx, e, c)?;
                if b.is_true() {
                    return Ok(Value::Bool(true));
                }
                if a.is_false() && b.is_false() {
                    Value::Bool(false)
                } else {
                    Value::Null
                }
            }
            Expr::Not(x) => {
                let v = x.eval(cx, e, c)?;
                if v.is_null() {
                    Value::Null
                } else {
                    Value::Bool(!v.is_true())
                }
            }
            Expr::IsNull(x, negated) => Value::Bool(x.eval(cx, e, c)?.is_null() != *negated),
            Expr::InConst { e: x, items, negated, set } => {
                let v = x.eval(cx, e, c)?;
                match v {
                    Value::Null => Value::Null,
                    Value::Py(_) => match value::in_set(py, cx.ops, set, &v)? {
                        None => Value::Null,
                        Some(found) => Value::Bool(found != *negated),
                    },
                    _ => {
                        let mut found = false;
                        for it in items {
                            if value::py_eq(py, cx.ops, &v, it)? {
                                found = true;
                                break;
                            }
                        }
                        Value::Bool(found != *negated)
                    }
                }
            }
            Expr::InList { e: x, items, negated } => {
                let v = x.eval(cx, e, c)?;
                if v.is_null() {
                    return Ok(Value::Null);
                }
                let mut unknown = false;
                for it in items {
                    let w = it.eval(cx, e, c)?;
                    if w.is_null() {
                        unknown = true;
                    } else if value::py_eq(py, cx.ops, &w, &v)? {
                        return Ok(Value::Bool(!*negated));
                    }
                }
                if unknown {
                    Value::Null
                } else {
                    Value::Bool(*negated)
                }
            }
            Expr::Str { op, e: x, arg, negated, regex } => {
                let v = x.eval(cx, e, c)?;
                let Some(v) = v.as_str(py) else { return Ok(Value::Null) };
                let w = arg.eval(cx, e, c)?;
                let Some(w) = w.as_str(py) else { return Ok(Value::Null) };
                let t = match op {
                    StrOpK::Contains => v.contains(w.as_ref()),
                    StrOpK::Starts => v.starts_with(w.as_ref()),
                    StrOpK::Ends => v.ends_with(w.as_ref()),
                    StrOpK::Matches => match regex {
                        Some(r) => r.is_match(&v),
                        None => return Ok(Value::Null),
                    },
                };
                Value::Bool(t != *negated)
            }
            Expr::Func(f, args) => {
                if let FuncK::Coalesce = f {
                    let mut out = Value::Null;
                    for a in args {
                        let v = a.eval(cx, e, c)?;
                        if out.is_null() && !v.is_null() {
                            out = v;
                        }
                    }
                    return Ok(out);
                }
                let v = args[0].eval(cx, e, c)?;
                if v.is_null() {
                    return Ok(Value::Null);
                }
                match f {
                    FuncK::Abs => value::abs(py, cx.ops, &v)?,
                    FuncK::Lower => value::case(py, cx.ops, &v, false)?,
                    FuncK::Upper => value::case(py, cx.ops, &v, true)?,
                    FuncK::Length => value::length(py, cx.ops, &v)?,
                    FuncK::Coalesce => Value::Null,
                }
            }
        })
    }

}

/// The event whose row `FIRST(var.x)` / `LAST(var.x)` (`Expr::VarRow`) reads: the first (or
/// last) capture of the variable in the match `c`, else the event `e` being tested when it is
/// being tested for the variable (`cur`; LAST then always reads it); None: the value is NULL.
#[inline]
fn row_event<'a>(var: u32, first: bool, cur: bool, e: &'a Ev, c: &'a CapVec) -> Option<&'a Ev> {
    if cur && !first {
        return Some(e);
    }
    let mut caps = c.iter().filter(|cap| cap.var == var);
    let found = if first { caps.next() } else { caps.next_back() };
    match found {
        Some(cap) => Some(&cap.ev),
        None if cur => Some(e),
        None => None,
    }
}

/// `l op r` when both sides are numbers (`Expr::num`): the comparison without a `Value`.
#[inline]
fn cmp_num(op: CmpOp, l: &Expr, r: &Expr, cx: &Cx, e: &Ev, c: &CapVec) -> Option<bool> {
    let x = l.num(cx, e, c)?;
    let y = r.num(cx, e, c)?;
    Some(value::holds(op, value::num_cmp(x, y)))
}

/// `l op r` by `value::compare`.
fn compare(cx: &Cx, op: CmpOp, l: &Expr, r: &Expr, e: &Ev, c: &CapVec) -> PyResult<Value> {
    binary(cx, l, r, e, c, |a, b| value::compare(cx.py, cx.ops, op, a, b))
}

/// `f` on the values of `l` and `r`; NULL when either is NULL (`r` is not evaluated then).
#[inline]
fn binary(cx: &Cx, l: &Expr, r: &Expr, e: &Ev, c: &CapVec, f: impl FnOnce(&Value, &Value) -> PyResult<Value>) -> PyResult<Value> {
    let a = l.operand(cx, e, c)?;
    if a.is_null() {
        return Ok(Value::Null);
    }
    let b = r.operand(cx, e, c)?;
    if b.is_null() {
        return Ok(Value::Null);
    }
    f(&a, &b)
}

/// An aggregate computed over the captures (and the current event when `cur`), as `cep.expr`'s
/// `Agg` computes it: every row value first, then `sum()` / `min()` / `max()` left to right.
#[allow(clippy::too_many_arguments)]
fn agg(cx: &Cx, func: AggF, var: Option<u32>, row: Option<&Expr>, cur: bool, e: &Ev, c: &[Cap]) -> PyResult<Value> {
    let mut events: Vec<&Ev> = c.iter().filter(|x| var.is_none_or(|v| x.var == v)).map(|x| &x.ev).collect();
    if cur {
        events.push(e);
    }
    let Some(row) = row else {
        return Ok(Value::Int(events.len() as i64));
    };
    let mut vals = Vec::with_capacity(events.len());
    for ev in events {
        let v = row.eval(cx, ev, &NO_CAPS)?;
        if !v.is_null() {
            vals.push(v);
        }
    }
    let n = vals.len() as i64;
    if let AggF::Count = func {
        return Ok(Value::Int(n));
    }
    let mut fold = Fold::Empty;
    for v in vals {
        fold = fold_step(cx, func, &fold, v)?;
        if let Fold::Null = fold {
            break;
        }
    }
    finish(cx, func, &fold, n)
}

/// One step of `sum()` (SUM, AVG: `0 + v1 + v2 ...`, left to right as Python 3.11 adds) or of
/// `min()` / `max()` (the first value, then each value that compares below / above the best so
/// far), from `fold` with the next non-NULL value `v`. A step Python answers with TypeError (the
/// core's operators give NULL there) makes the aggregate NULL for good, as `cep.expr` catches it.
pub fn fold_step(cx: &Cx, func: AggF, fold: &Fold, v: Value) -> PyResult<Fold> {
    let (py, ops) = (cx.py, cx.ops);
    let value_or_null = |x: Value| if x.is_null() { Fold::Null } else { Fold::Val(x) };
    Ok(match (func, fold) {
        (AggF::Count, _) | (_, Fold::Null) => fold.clone(),
        (AggF::Sum | AggF::Avg, Fold::Empty) => value_or_null(value::arith(py, ops, ArOp::Add, &Value::Int(0), &v)?),
        (AggF::Sum | AggF::Avg, Fold::Val(a)) => value_or_null(value::arith(py, ops, ArOp::Add, a, &v)?),
        (AggF::Min | AggF::Max, Fold::Empty) => Fold::Val(v),
        (AggF::Min | AggF::Max, Fold::Val(best)) => match value::less(py, ops, &v, best, matches!(func, AggF::Max))? {
            None => Fold::Null,
            Some(true) => Fold::Val(v),
            Some(false) => fold.clone(),
        },
    })
}

/// The aggregate's value from its fold over `n` values (AVG divides the sum by `n`).
fn finish(cx: &Cx, func: AggF, fold: &Fold, n: i64) -> PyResult<Value> {
    Ok(match (func, fold) {
        (AggF::Count, _) => Value::Int(n),
        (_, Fold::Empty | Fold::Null) => Value::Null,
        (AggF::Avg, Fold::Val(sum)) => value::arith(cx.py, cx.ops, ArOp::Div, sum, &Value::Int(n))?,
        (_, Fold::Val(x)) => x.clone(),
    })
}

/// A condition aggregate read from the partial match's running state (`CapVec::acc`), combined
/// with the current event when `cur`; recomputed over the captures (`agg`) when that state is
/// not kept (captures read back from serialised state) or broken (a Python exception).
fn agg_slot(cx: &Cx, slot: usize, cur: bool, e: &Ev, c: &CapVec) -> PyResult<Value> {
    let spec = &cx.aggs[slot];
    let slow = || agg(cx, spec.func, spec.var, spec.row.as_ref(), cur, e, c);
    let acc = match c.acc.get(slot) {
        Some(a) if !a.broken => a,
        _ => return slow(),
    };
    let mut n = acc.n;
    let mut next = None;
    if cur {
        match &spec.row {
            None => n += 1,
            Some(row) => {
                let v = match cx.memo(slot, row, e) {
                    Some(Some(v)) => v.clone(),
                    Some(None) => return slow(), // the row raises: as Python raises it
                    None => row.eval(cx, e, &NO_CAPS)?,
                };
                if !v.is_null() {
                    n += 1;
                    next = Some(v);
                }
            }
        }
    }
    match next {
        Some(v) if !matches!(spec.func, AggF::Count) => finish(cx, spec.func, &fold_step(cx, spec.func, &acc.fold, v)?, n),
        _ => finish(cx, spec.func, &acc.fold, n),
    }
}

/// `agg_slot` when its value is a native number computed from the running state alone (no
/// Python, no recomputation over the captures); `None` sends the caller to `agg_slot`.
#[inline(always)]
fn agg_slot_num(cx: &Cx, slot: usize, cur: bool, e: &Ev, c: &CapVec) -> Option<Num> {
    let spec = &cx.aggs[slot];
    let acc = c.acc.get(slot).filter(|a| !a.broken)?;
    let mut n = acc.n;
    let mut fold = match &acc.fold {
        Fold::Val(v) => Some(value::num(v)?),
        Fold::Empty => None,
        Fold::Null => return None,
    };
    if let (true, Some(row)) = (cur, &spec.row) {
        // The row's value, borrowed from the event's memo (not copied per partial match).
        let owned: Value;
        let v = match cx.memo(slot, row, e) {
            Some(v) => v.as_ref()?,
            None => {
                owned = row.eval(cx, e, &NO_CAPS).ok()?;
                &owned
            }
        };
        if !v.is_null() {
            n += 1;
            // `fold_step`: the running sum from 0, or the first value, or a better one.
            fold = match (spec.func, fold) {
                (AggF::Count, f) => f,
                (AggF::Sum | AggF::Avg, f) => value::arith_num(ArOp::Add, f.unwrap_or(Num::I(0)), value::num(v)?)?,
                (AggF::Min | AggF::Max, None) => Some(value::num(v)?),
                (AggF::Min | AggF::Max, Some(best)) => {
                    let x = value::num(v)?;
                    let op = if matches!(spec.func, AggF::Max) { CmpOp::Gt } else { CmpOp::Lt };
                    Some(if value::holds(op, value::num_cmp(x, best)) { x } else { best })
                }
            };
        }
    } else if cur {
        n += 1; // COUNT(var.*)
    }
    match (spec.func, fold) {
        (AggF::Count, _) => Some(Num::I(n)),
        (_, None) => None,
        (AggF::Avg, Some(sum)) => value::arith_num(ArOp::Div, sum, Num::I(n))?,
        (_, Some(x)) => Some(x),
    }
}

impl CapVec {
    /// Folds the capture just appended (the event being fed: its row values are read through
    /// `cx.rows`) into the running aggregates; when they are not kept yet (captures read back
    /// from state), the earlier captures are folded first.
    pub fn fold_last(&mut self, cx: &Cx) {
        let n = cx.aggs.len();
        if n == 0 || self.v.is_empty() {
            return;
        }
        let last = self.v.len() - 1;
        if self.acc.len() != n {
            // In place: a pooled vector (`matcher::Pool`, emptied) keeps its allocation.
            self.acc.clear();
            self.acc.resize(n, Acc::default());
            for i in 0..last {
                fold_cap(cx, &mut self.acc, &self.v[i], false);
            }
        }
        fold_cap(cx, &mut self.acc, &self.v[last], true);
    }
}

/// Adds capture `cap` to every aggregate over its variable. A row or a step that raises marks
/// the aggregate broken (recomputed when read, which raises it then, as Python does).
fn fold_cap(cx: &Cx, acc: &mut [Acc], cap: &Cap, current: bool) {
    for (slot, (a, spec)) in acc.iter_mut().zip(cx.aggs).enumerate() {
        if a.broken || spec.var.is_some_and(|v| v != cap.var) {
            continue;
        }
        let Some(row) = &spec.row else {
            a.n += 1;
            continue;
        };
        // The row's value, borrowed from the event's memo when it is the event being fed.
        let owned: Option<Value>;
        let v = match current.then(|| cx.memo(slot, row, &cap.ev)).flatten() {
            Some(v) => v.as_ref(),
            None => {
                owned = row.eval(cx, &cap.ev, &NO_CAPS).ok();
                owned.as_ref()
            }
        };
        let Some(v) = v else {
            a.broken = true;
            continue;
        };
        if v.is_null() {
            continue;
        }
        a.n += 1;
        if matches!(spec.func, AggF::Count) {
            continue;
        }
        // A running sum of floats or of ints that stay within 64 bits: added in place (the
        // value `value::arith` gives; anything else takes `fold_step`).
        if let (AggF::Sum | AggF::Avg, Fold::Val(sum)) = (spec.func, &mut a.fold) {
            match (sum, v) {
                (Value::Float(x), Value::Float(y)) => {
                    *x += *y;
                    continue;
                }
                (Value::Int(x), Value::Int(y)) => {
                    if let Some(z) = x.checked_add(*y) {
                        *x = z;
                        continue;
                    }
                }
                _ => {}
            }
        }
        match fold_step(cx, spec.func, &a.fold, v.clone()) {
            Ok(f) => a.fold = f,
            Err(_) => a.broken = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Arrow event's lazy part is made on first use, once: the values set first stay (a
    /// second set is ignored, as `OnceLock`'s), every reader gets the same box, and an event
    /// never read allocates none.
    #[test]
    fn an_events_lazy_part_is_made_once_on_first_use() {
        let row = Row { cols: Arc::new(Cols { names: Vec::new(), py_names: Vec::new() }), vals: Vec::new() };
        let ev = Ev::from_row_lazy(row, 3, 10);
        assert!(ev.lazy.get().is_none() && ev.vals().is_none(), "nothing allocated before a read");
        ev.set_vals(vec![Value::Int(1)]);
        let first = ev.lazy.get().map(|l| l as *const Lazy);
        ev.set_vals(vec![Value::Int(2)]);
        assert!(matches!(ev.vals().map(Vec::as_slice), Some([Value::Int(1)])), "the first values stay");
        assert_eq!(ev.lazy.get().map(|l| l as *const Lazy), first, "one box");
        assert_eq!((ev.ts, ev.seqi), (10, 3));
    }

    /// An Arrow event is one block: its header, then the row's values moved in; the row read
    /// back (`row()`, `field_ref` through `pidx`) is the row given, a clone shares the block,
    /// and the block is 184 bytes for a fraud row's five values (a 192-byte mimalloc class).
    #[test]
    fn an_arrow_event_is_one_block_with_its_values() {
        let cols = Arc::new(Cols { names: ["card", "amount"].map(String::from).to_vec(), py_names: Vec::new() });
        let card: Arc<str> = Arc::from("card-1");
        let vals = vec![Value::Str(card.clone()), Value::Int(42)];
        let ev = Ev::from_vals(cols.clone(), vals.into_iter(), None, 7, 10, Arc::from([1u32, u32::MAX, 0]));
        assert_eq!((ev.ts, ev.seqi), (10, 7));
        let row = ev.row().expect("a row event");
        assert!(Arc::ptr_eq(row.cols, &cols));
        assert!(matches!(row.vals, [Value::Str(s), Value::Int(42)] if Arc::ptr_eq(s, &card)), "moved, not copied");
        assert!(matches!(row.get("amount"), Value::Int(42)) && row.get("none").is_null());
        let p = ev.pidx.as_deref().expect("projected");
        assert!(matches!(ev.row_vals()[p[0] as usize], Value::Int(42)));
        let other = ev.clone();
        assert!(Ev::ptr_eq(&ev, &other) && std::ptr::eq(other.row_vals().as_ptr(), ev.row_vals().as_ptr()));
        assert_eq!(Arc::strong_count(&card), 2, "one count for the event's cell, however many handles");
        // The block: the count, the header, the length, then the values in it (their offset
        // measured on the event, not added up).
        let head = ev.row_vals().as_ptr() as usize - ev.as_ptr() as usize;
        assert_eq!(head, 8 + std::mem::size_of::<EvHead>() + 8);
        assert_eq!(head + 5 * std::mem::size_of::<Value>(), 184);
        assert_eq!(std::mem::size_of::<Ev>(), 8);
        assert_eq!(std::mem::size_of::<Option<Ev>>(), 8);
        drop((ev, other));
        assert_eq!(Arc::strong_count(&card), 1, "the last handle drops the values");
    }
}
