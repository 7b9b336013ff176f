//! Reading the exported rule program (plain Python data, see `cep/program.py`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use crate::expr::{build, AggSpec, Expr};
use crate::Unsupported;

pub const FORMAT: &str = "cep-program";
pub const VERSION: i64 = 1;

pub fn bad(msg: &str) -> PyErr {
    Unsupported::new_err(msg.to_string())
}

pub fn get<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Bound<'py, PyAny>> {
    d.get_item(key)?.ok_or_else(|| bad(&format!("program: missing {key:?}")))
}

pub fn get_opt<'py>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(key)?.filter(|v| !v.is_none()))
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Conn {
    Strict,
    Relaxed,
    Any,
}

pub const DONE: i32 = -1;

pub struct StateT {
    pub absence: bool,
    pub var: usize,
    pub conn: Conn,
    pub next: Vec<i32>,
    pub not_next: Vec<usize>,
    pub not_followed: Vec<usize>,
    pub after: i32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SkipK {
    PastLastRow,
    ToNextRow,
    ToFirst,
    ToLast,
    AllMatches,
}

pub struct Program {
    pub rule_id: String,
    pub vars: Vec<String>,
    pub key_field: Option<String>,
    pub fields: Vec<Py<PyString>>,
    pub conds: Vec<Option<Expr>>,
    /// The aggregates of the conditions, kept per partial match (`Expr::AggSlot`).
    pub aggs: Vec<AggSpec>,
    /// The memo slots per event (`Cx::rows`): the aggregates' rows, then `Expr::Local`s.
    pub nmemo: usize,
    pub local: Vec<bool>,
    pub history_free: bool,
    pub table: Vec<StateT>,
    pub starts: Vec<(usize, Vec<i32>)>,
    pub within: Option<i64>,
    pub step: Option<i64>,
    pub skip: SkipK,
    pub skip_var: Option<u32>,
    pub measures: Vec<(String, Expr)>,
    pub emit_alert: String,
    pub timeout_alert: Option<String>,
    pub max_partial_matches: Option<usize>,
}

fn ints(obj: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    obj.extract::<Vec<i64>>()
}

pub fn parse(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<Program> {
    let d = obj.downcast::<PyDict>().map_err(|_| bad("program: a dict expected"))?;
    let format: String = get(d, "format")?.extract()?;
    let version: i64 = get(d, "version")?.extract()?;
    if format != FORMAT || version != VERSION {
        return Err(bad(&format!(
            "program format {format:?} version {version}; this core reads {FORMAT:?} version {VERSION}"
        )));
    }
    let vars: Vec<String> = get(d, "vars")?.extract()?;
    let nvars = vars.len();
    let field_names: Vec<String> = get(d, "fields")?.extract()?;
    let fields: Vec<Py<PyString>> = field_names.iter().map(|f| PyString::intern(py, f).unbind()).collect();
    let nf = fields.len();
    let cond_list = get(d, "conditions")?;
    let cond_list = cond_list.downcast::<PyList>().map_err(|_| bad("conditions: list expected"))?;
    let mut conds = Vec::new();
    for c in cond_list.iter() {
        conds.push(if c.is_none() { None } else { Some(build(py, &c, nf)?) });
    }
    let mut aggs = Vec::new();
    for c in conds.iter_mut().flatten() {
        c.slot_aggs(&mut aggs);
    }
    let local: Vec<bool> = get(d, "local")?.extract()?;
    // The memo slots of an event (`Cx::rows`): one per aggregate's row, then one per part of a
    // condition that reads captures but has parts that read only the event.
    let mut nmemo = aggs.len() as u32;
    for (c, &l) in conds.iter_mut().zip(&local) {
        if let (Some(c), false) = (c, l) {
            c.memo_locals(&mut nmemo);
        }
    }
    if conds.len() != nvars || local.len() != nvars {
        return Err(bad("one condition per variable expected"));
    }
    let st_list = get(d, "states")?;
    let st_list = st_list.downcast::<PyList>().map_err(|_| bad("states: list expected"))?;
    let n = st_list.len() as i64;
    let mut table = Vec::new();
    for s in st_list.iter() {
        let s = s.downcast::<PyDict>().map_err(|_| bad("state: dict expected"))?;
        let absence: bool = get(s, "absence")?.extract()?;
        let var: i64 = get(s, "var")?.extract()?;
        let conn = match get(s, "conn")?.extract::<String>()?.as_str() {
            "strict" => Conn::Strict,
            "relaxed" => Conn::Relaxed,
            "any" => Conn::Any,
            c => return Err(bad(&format!("unknown connector {c}"))),
        };
        let next = ints(&get(s, "next")?)?;
        let guard = |k: &str| -> PyResult<Vec<usize>> {
            let v = ints(&get(s, k)?)?;
            if v.iter().any(|&g| g < 0 || g as usize >= nvars) {
                return Err(bad("guard on unknown variable"));
            }
            Ok(v.into_iter().map(|g| g as usize).collect())
        };
        let not_next = guard("not_next")?;
        let not_followed = guard("not_followed")?;
        let after_first: i64 = get(s, "after_first")?.extract()?;
        if next.iter().any(|&t| t != DONE as i64 && !(0..n).contains(&t)) || after_first >= n {
            return Err(bad("transition to a missing state"));
        }
        if !absence && (var < 0 || var as usize >= nvars) {
            return Err(bad("step state without a variable"));
        }
        let id = table.len() as i32;
        table.push(StateT {
            absence,
            var: var.max(0) as usize,
            conn,
            next: next.iter().map(|&t| t as i32).collect(),
            not_next,
            not_followed,
            after: if after_first >= 0 { after_first as i32 } else { id },
        });
    }
    let initial = ints(&get(d, "initial")?)?;
    let mut starts = Vec::new();
    for s in initial {
        if !(0..n).contains(&s) || table[s as usize].absence {
            return Err(bad("initial state must be a step state"));
        }
        let st = &table[s as usize];
        starts.push((st.var, st.next.clone()));
    }
    let skip = get(d, "skip")?;
    let skip = skip.downcast::<PyDict>().map_err(|_| bad("skip: dict expected"))?;
    let skip_kind = match get(skip, "kind")?.extract::<String>()?.as_str() {
        "PAST_LAST_ROW" => SkipK::PastLastRow,
        "TO_NEXT_ROW" => SkipK::ToNextRow,
        "TO_FIRST" => SkipK::ToFirst,
        "TO_LAST" => SkipK::ToLast,
        "ALL_MATCHES" => SkipK::AllMatches,
        k => return Err(bad(&format!("unknown skip {k}"))),
    };
    let skip_var = get_opt(skip, "var")?.map(|v| v.extract::<u32>()).transpose()?;
    let mlist = get(d, "measures")?;
    let mlist = mlist.downcast::<PyList>().map_err(|_| bad("measures: list expected"))?;
    let mut measures = Vec::new();
    for m in mlist.iter() {
        let name: String = m.get_item(0)?.extract()?;
        measures.push((name, build(py, &m.get_item(1)?, nf)?));
    }
    let pos = |k: &str| -> PyResult<Option<i64>> {
        let v = get_opt(d, k)?.map(|v| v.extract::<i64>()).transpose()?;
        if v.is_some_and(|x| x <= 0) {
            return Err(bad("time limits must be positive"));
        }
        Ok(v)
    };
    Ok(Program {
        rule_id: get(d, "rule_id")?.extract()?,
        vars,
        key_field: get_opt(d, "key_field")?.map(|v| v.extract::<String>()).transpose()?,
        fields,
        conds,
        aggs,
        nmemo: nmemo as usize,
        local,
        history_free: get(d, "history_free")?.extract()?,
        table,
        starts,
        within: pos("within_ms")?,
        step: pos("step_ms")?,
        skip: skip_kind,
        skip_var,
        measures,
        emit_alert: get(d, "emit_alert")?.extract()?,
        timeout_alert: get_opt(d, "timeout_alert")?.map(|v| v.extract::<String>()).transpose()?,
        max_partial_matches: get_opt(d, "max_partial_matches")?.map(|v| v.extract::<usize>()).transpose()?,
    })
}
