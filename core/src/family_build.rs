//! Which rules of a group form a family (docs/rule-families.md), and the threshold form of a
//! condition that differs only in its constant (`Thresh`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::engine::{canon, RuleE, NO_FAM};
use crate::expr::Expr;
use crate::family::{Family, Vary};
use crate::program::{get, get_opt};
use crate::value::{self, CmpOp, Value};

/// A varying local condition that is `field op constant` in every member (or `constant op
/// field`): the field is read once per event and compared with each member's constant.
pub struct Thresh {
    op: CmpOp,
    pub field: usize,
    const_left: bool,
    consts: Vec<Value>,
    /// For an ordering (`<`, `<=`, `>`, `>=`) over numeric constants (no NaN): the members in
    /// ascending order of their constant, and `pre[k]`, the mask of the first `k` of them. A
    /// number compared with ascending constants holds on a prefix or a suffix of them, so the
    /// mask is found with a binary search (the same comparisons, fewer of them).
    sorted: Option<(Vec<usize>, Vec<u64>)>,
}

impl Thresh {
    fn holds(&self, py: Python<'_>, ops: &value::PyOps, a: &Value, k: usize) -> PyResult<bool> {
        let c = &self.consts[k];
        let (l, r) = if self.const_left { (c, a) } else { (a, c) };
        Ok(!c.is_null() && value::compare(py, ops, self.op, l, r)?.is_true())
    }

    /// The members whose `field op constant` holds for field value `a` (not NULL).
    pub fn mask(&self, py: Python<'_>, ops: &value::PyOps, a: &Value) -> PyResult<u64> {
        if let (Some((order, pre)), Value::Int(_) | Value::Float(_)) = (&self.sorted, a) {
            let n = order.len();
            let first = self.holds(py, ops, a, order[0])?;
            if first == self.holds(py, ops, a, order[n - 1])? {
                return Ok(if first { pre[n] } else { 0 });
            }
            // The first k (in ascending order) where the comparison gives `!first`.
            let (mut lo, mut hi) = (1, n - 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if self.holds(py, ops, a, order[mid])? == first {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            return Ok(if first { pre[lo] } else { pre[n] & !pre[lo] });
        }
        let mut r = 0u64;
        for k in 0..self.consts.len() {
            if self.holds(py, ops, a, k)? {
                r |= 1 << k;
            }
        }
        Ok(r)
    }
}

/// What makes rules one family, and each condition's own text.
pub struct Shape {
    /// The program with every constant masked, and WITHIN / STEP WITHIN only as present or not.
    key: String,
    /// Per variable, the condition's text with its constants.
    conds: Vec<String>,
}

/// A rule's shape (None: the rule runs on its own: ON TIMEOUT, more than 8 variables).
/// `names`: the program's field table (conditions are compared over field names).
pub fn shape(d: &Bound<'_, PyDict>, names: &[String]) -> PyResult<Option<Shape>> {
    let nvars = get(d, "vars")?.len()?;
    if get_opt(d, "timeout_alert")?.is_some() || nvars > 8 {
        return Ok(None);
    }
    let mut key = String::new();
    for k in ["vars", "key_field", "states", "initial", "local", "history_free", "skip"] {
        canon(&get(d, k)?, names, &mut key, true)?;
        key.push('|');
    }
    for k in ["within_ms", "step_ms"] {
        key.push(if get_opt(d, k)?.is_some() { 'T' } else { 'F' });
    }
    let mut conds = Vec::with_capacity(nvars);
    for c in get(d, "conditions")?.try_iter()? {
        let c = c?;
        canon(&c, names, &mut key, true)?;
        key.push('|');
        let mut text = String::new();
        canon(&c, names, &mut text, false)?;
        conds.push(text);
    }
    Ok(Some(Shape { key, conds }))
}

/// The families of each group's rules: rules of equal shape, 2 to 64 per family, whose varying
/// conditions hold no aggregate (the running aggregates of a shared capture vector must be the
/// same for every member). Also each rule's family (`NO_FAM`: none).
pub fn build(rules: &[RuleE], groups: &[&[usize]], shapes: &[Option<Shape>]) -> (Vec<Family>, Vec<u32>) {
    let mut fams = Vec::new();
    let mut fam_of = vec![NO_FAM; rules.len()];
    for g in groups {
        let mut buckets: Vec<(&str, Vec<usize>)> = Vec::new();
        for &ri in g.iter() {
            let Some(sh) = &shapes[ri] else { continue };
            match buckets.iter_mut().find(|b| b.0 == sh.key) {
                Some(b) => b.1.push(ri),
                None => buckets.push((&sh.key, vec![ri])),
            }
        }
        for (_, bucket) in buckets {
            let mut bucket = bucket;
            bucket.sort_by_key(|&ri| (rules[ri].core.p.within, rules[ri].core.p.step));
            for members in bucket.chunks(64).filter(|c| c.len() >= 2) {
                let cond = |ri: usize, v: usize| shapes[ri].as_ref().map_or("", |s| s.conds[v].as_str());
                let rep = &rules[members[0]].core;
                let nvars = rep.p.vars.len();
                let vary: Vec<Vary> = (0..nvars)
                    .map(|v| match members.iter().all(|&ri| cond(ri, v) == cond(members[0], v)) {
                        true => Vary::Same,
                        false if rep.p.local[v] => Vary::Local,
                        false => Vary::Other,
                    })
                    .collect();
                let agg_varies = (0..nvars).any(|v| vary[v] != Vary::Same && members.iter().any(|&ri| cond(ri, v).contains("str:'agg'")));
                if agg_varies || members.iter().any(|&ri| rules[ri].core.p.nmemo > 8) {
                    continue;
                }
                let fi = fams.len() as u32;
                for &ri in members {
                    fam_of[ri] = fi;
                }
                let steps: Vec<Option<i64>> = members.iter().map(|&ri| rules[ri].core.p.step).collect();
                fams.push(Family {
                    members: members.to_vec(),
                    thresh: (0..nvars).map(|v| if vary[v] == Vary::Local { thresh(rules, members, v) } else { None }).collect(),
                    mono: steps.windows(2).all(|w| w[0] <= w[1]),
                    vary,
                    within: members.iter().map(|&ri| rules[ri].core.p.within).collect(),
                    step: steps,
                    timed: rep.p.within.is_some() || rep.p.step.is_some(),
                    stepped: rep.p.step.is_some(),
                    min_cap: members.iter().map(|&ri| rules[ri].core.cap).min().unwrap_or(0),
                    scratch: Default::default(),
                });
            }
        }
    }
    (fams, fam_of)
}

/// `Thresh` of variable `v` when every member's condition is `field op constant` (or `constant op
/// field`) with one operator and one field.
fn thresh(rules: &[RuleE], members: &[usize], v: usize) -> Option<Thresh> {
    let mut th: Option<Thresh> = None;
    for &ri in members {
        let Some(Expr::Cmp(op, l, r)) = &rules[ri].core.p.conds[v] else { return None };
        let (field, c, const_left) = match (&**l, &**r) {
            (Expr::Field(f), Expr::Const(c)) => (*f, c, false),
            (Expr::Const(c), Expr::Field(f)) => (*f, c, true),
            _ => return None,
        };
        match &mut th {
            None => th = Some(Thresh { op: *op, field, const_left, consts: vec![c.clone()], sorted: None }),
            Some(t) if t.op == *op && t.field == field && t.const_left == const_left => t.consts.push(c.clone()),
            Some(_) => return None,
        }
    }
    let mut th = th?;
    let num = |v: &Value| match v {
        Value::Int(x) => Some(*x as f64),
        Value::Float(x) if !x.is_nan() => Some(*x),
        _ => None,
    };
    let ordering = matches!(th.op, CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge);
    // Sorted by an exact comparison (ints and floats compared as Python compares them).
    let exact = |a: &Value, b: &Value| match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        _ => num(a).partial_cmp(&num(b)).unwrap_or(std::cmp::Ordering::Equal),
    };
    let ints_fit = th.consts.iter().all(|c| !matches!(c, Value::Int(x) if x.unsigned_abs() > 1 << 53));
    if ordering && ints_fit && th.consts.iter().all(|c| num(c).is_some()) {
        let mut order: Vec<usize> = (0..th.consts.len()).collect();
        order.sort_by(|&a, &b| exact(&th.consts[a], &th.consts[b]));
        let mut pre = vec![0u64];
        for &k in &order {
            pre.push(pre[pre.len() - 1] | 1 << k);
        }
        th.sorted = Some((order, pre));
    }
    Some(th)
}
