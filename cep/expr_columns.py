"""Vectorised evaluation of local expressions (`Expr.is_local`) over numpy columns.

Not used by the engines today (the matcher's `pre` argument could take its masks); kept, with
its differential test against the closures (tests/rules/test_expr.py), for a vectorised path.
It imports `cep.expr`; `cep.expr` does not import it.

Each node evaluates to a pair `(values, valid)` of equal-length arrays; `valid` is False where the
value is NULL. NULL comes from a missing column, `None` in an object column, or NaN in a float
column (pandas' missing value; JSON events never carry NaN, so this agrees with the closures).
The result of `condition_mask` is True exactly where the closure would return True.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from cep import expr as X

Pair = tuple[np.ndarray, np.ndarray]


def condition_mask(node: X.Expr, columns: Mapping[str, np.ndarray]) -> np.ndarray:
    if not node.is_local:
        raise ValueError(f"not a local expression: {node}")
    n = _length(columns)
    values, valid = _eval(node, columns, n)
    if values.dtype != np.bool_:
        values = np.array([v is True for v in values], dtype=bool)
    return np.asarray(values & valid, dtype=bool)


def _length(columns: Mapping[str, np.ndarray]) -> int:
    lengths = {len(c) for c in columns.values()}
    if len(lengths) > 1:
        raise ValueError("columns have different lengths")
    return lengths.pop() if lengths else 0


def _column(columns: Mapping[str, np.ndarray], name: str, n: int) -> Pair:
    col = columns.get(name)
    if col is None:
        return np.full(n, None, dtype=object), np.zeros(n, dtype=bool)
    col = np.asarray(col)
    if col.dtype.kind == "f":
        return col, ~np.isnan(col)
    if col.dtype.kind in "iub":
        return col, np.ones(n, dtype=bool)
    valid = np.array(
        [not (v is None or (isinstance(v, float) and math.isnan(v))) for v in col], dtype=bool
    )
    return col.astype(object), valid


def _numeric(a: np.ndarray) -> bool:
    return a.dtype.kind in "iuf"


def _elementwise(fn: Callable[..., Any], n: int, *pairs: Pair) -> Pair:
    """Apply a scalar function where all inputs are valid; None/exceptions give NULL."""
    out = np.full(n, None, dtype=object)
    valid = np.ones(n, dtype=bool)
    for p in pairs:
        valid &= p[1]
    for i in np.flatnonzero(valid):
        try:
            out[i] = fn(*(p[0][i] for p in pairs))
        except (TypeError, ZeroDivisionError, OverflowError, ValueError):
            out[i] = None
    ok = np.array([v is not None for v in out], dtype=bool) & valid
    return out, ok


def _as_bool(p: Pair) -> Pair:
    values, valid = p
    if values.dtype == np.bool_:
        return values, valid
    truth = np.array([v is True or v is np.True_ for v in values], dtype=bool)
    known = valid & np.array([isinstance(v, bool | np.bool_) for v in values], dtype=bool)
    return truth, known


def _eval(node: X.Expr, cols: Mapping[str, np.ndarray], n: int) -> Pair:  # noqa: C901
    if isinstance(node, X.Const):
        if node.value is None:
            return np.full(n, None, dtype=object), np.zeros(n, dtype=bool)
        if isinstance(node.value, bool | int | float):
            return np.full(n, node.value), np.ones(n, dtype=bool)
        return np.full(n, node.value, dtype=object), np.ones(n, dtype=bool)
    if isinstance(node, X.Field):
        return _column(cols, node.name, n)
    if isinstance(node, X.Path):
        get = node.bind()
        base, _ = _column(cols, node.name, n)
        values = np.array([get({node.name: v}, ()) for v in base], dtype=object)
        return values, np.array([v is not None for v in values], dtype=bool)
    if isinstance(node, X.Neg):
        v, ok = _eval(node.operand, cols, n)
        if _numeric(v):
            return -v, ok
        return _elementwise(lambda a: None if isinstance(a, bool) else -a, n, (v, ok))
    if isinstance(node, X.Arith):
        a, b = _eval(node.left, cols, n), _eval(node.right, cols, n)
        if _numeric(a[0]) and _numeric(b[0]) and node.op in "+-*":
            return X.ARITH[node.op](a[0], b[0]), a[1] & b[1]
        op = X.ARITH[node.op]
        return _elementwise(lambda x, y: None if node.op in "/%" and y == 0 else op(x, y), n, a, b)
    if isinstance(node, X.Compare):
        a, b = _eval(node.left, cols, n), _eval(node.right, cols, n)
        if _numeric(a[0]) and _numeric(b[0]):
            with np.errstate(invalid="ignore"):
                return np.asarray(X.COMPARE[node.op](a[0], b[0]), dtype=bool), a[1] & b[1]
        op = X.COMPARE[node.op]
        return _as_bool(_elementwise(lambda x, y: bool(op(x, y)), n, a, b))
    if isinstance(node, X.And | X.Or):
        (av, ak), (bv, bk) = (
            _as_bool(_eval(node.left, cols, n)),
            _as_bool(_eval(node.right, cols, n)),
        )
        if isinstance(node, X.And):
            false = (ak & ~av) | (bk & ~bv)
            true = ak & av & bk & bv
        else:
            true = (ak & av) | (bk & bv)
            false = ak & ~av & bk & ~bv
        return true, true | false
    if isinstance(node, X.Not):
        v, ok = _as_bool(_eval(node.operand, cols, n))
        return ~v, ok
    if isinstance(node, X.IsNull):
        _, ok = _eval(node.operand, cols, n)
        return (ok if node.negated else ~ok), np.ones(n, dtype=bool)
    if isinstance(node, X.InList | X.StrOp | X.Func):
        fn = node.bind()
        return _scalar_rows(node, fn, cols, n)
    raise ValueError(f"cannot vectorise {type(node).__name__}")


def _scalar_rows(node: X.Expr, fn: X.Fn, cols: Mapping[str, np.ndarray], n: int) -> Pair:
    """Row-at-a-time fallback for string predicates, IN and functions (still one pass)."""
    names = sorted(node.fields())
    pairs = [_column(cols, name, n) for name in names]
    out = np.full(n, None, dtype=object)
    for i in range(n):
        row = {name: (p[0][i] if p[1][i] else None) for name, p in zip(names, pairs, strict=True)}
        out[i] = fn(row, ())
    ok = np.array([v is not None for v in out], dtype=bool)
    if all(isinstance(v, bool) for v in out[ok]):
        return np.array([v is True for v in out], dtype=bool), ok
    return out, ok
