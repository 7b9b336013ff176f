"""Geo clauses: the grid-cell index returns exactly what a naive scan returns, and the scan agrees
with an independent computation of distance (unit vectors) and boxes."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.errors import QueryError
from percolator import FieldType, Percolator, SavedSearch, Schema
from percolator.geo import EARTH_RADIUS_M
from tests.hyp import examples

SCHEMA = Schema({"loc": FieldType.GEO_POINT, "title": FieldType.TEXT})
lats = st.floats(-90, 90, allow_nan=False).map(lambda x: round(x, 4))
lons = st.floats(-180, 180, allow_nan=False).map(lambda x: round(x, 4))
# Points cluster near a few places (and the antimeridian and a pole) so that queries hit.
CENTRES = [(52.37, 4.89), (0.0, 179.9), (89.9, 0.0), (-33.9, 151.2), (0.0, -179.95)]


@st.composite
def near(draw: st.DrawFn) -> tuple[float, float]:
    if draw(st.booleans()):
        return draw(lats), draw(lons)
    lat, lon = draw(st.sampled_from(CENTRES))
    dlat = draw(st.floats(-2, 2, allow_nan=False))
    dlon = draw(st.floats(-2, 2, allow_nan=False))
    lon2 = lon + dlon
    lon2 = lon2 - 360 if lon2 > 180 else lon2 + 360 if lon2 < -180 else lon2
    return round(max(-90, min(90, lat + dlat)), 4), round(lon2, 4)


@st.composite
def geo_query(draw: st.DrawFn) -> tuple[str, tuple]:
    lat, lon = draw(near())
    if draw(st.booleans()):
        km = draw(st.sampled_from([0.5, 5, 50, 300, 3000, 15000]))
        return f"loc:geo_distance({lat}, {lon}, {km}km)", ("d", lat, lon, km * 1000)
    h, w = draw(st.sampled_from([0.1, 1, 3, 40])), draw(st.sampled_from([0.1, 1, 3, 90, 300]))
    top, bottom = min(90.0, round(lat + h, 4)), max(-90.0, round(lat - h, 4))
    left, right = lon - w, lon + w
    left = round(left + 360 if left < -180 else left, 4)
    right = round(right - 360 if right > 180 else right, 4)
    return f"loc:geo_box({top}, {left}, {bottom}, {right})", ("b", top, left, bottom, right)


@st.composite
def event(draw: st.DrawFn) -> dict:
    pts = draw(st.lists(near(), min_size=0, max_size=3))
    forms = [lambda p: {"lat": p[0], "lon": p[1]}, lambda p: [p[1], p[0]],
             lambda p: f"{p[0]},{p[1]}"]
    vals = [draw(st.sampled_from(forms))(p) for p in pts]
    ev: dict = {"title": "house"}
    if vals:
        ev["loc"] = vals[0] if len(vals) == 1 else vals
    return ev, pts


def _unit(lat: float, lon: float) -> tuple[float, float, float]:
    a, b = math.radians(lat), math.radians(lon)
    return (math.cos(a) * math.cos(b), math.cos(a) * math.sin(b), math.sin(a))


def _expected(spec: tuple, pts: list) -> bool | None:
    """True/False, or None when a point is too close to the edge to judge independently."""
    out = False
    for lat, lon in pts:
        if spec[0] == "d":
            _, clat, clon, m = spec
            u, v = _unit(lat, lon), _unit(clat, clon)
            dot = max(-1.0, min(1.0, sum(x * y for x, y in zip(u, v, strict=True))))
            d = EARTH_RADIUS_M * math.acos(dot)
            if abs(d - m) < 1.0:
                return None
            out |= d <= m
        else:
            _, top, left, bottom, right = spec
            in_lon = left <= lon <= right if left <= right else (lon >= left or lon <= right)
            out |= bottom <= lat <= top and in_lon
    return out


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(geo_query(), min_size=1, max_size=12), st.lists(event(), min_size=1,
                                                                max_size=6))
def test_geo_index_equals_scan_and_geometry(queries: list, events: list) -> None:
    perc = Percolator.from_searches(
        (SavedSearch(f"q{i}", "o", q) for i, (q, _) in enumerate(queries)), SCHEMA)
    evs = [e for e, _ in events]
    notes = perc.match_batch(evs)
    for i, (ev, pts) in enumerate(events):
        scan = perc.scan(ev)
        assert sorted(n.search_id for n in notes if n.position == i) == scan
        for j, (_, spec) in enumerate(queries):
            want = _expected(spec, pts)
            if want is not None:
                assert (f"q{j}" in scan) == want, (spec, pts)


def test_geo_anchors_on_cells_not_the_always_run_list() -> None:
    perc = Percolator.from_searches(
        [SavedSearch("a", "o", "loc:geo_distance(52.37, 4.89, 10km)"),
         SavedSearch("b", "o", "loc:geo_box(53, 4, 52, 6) AND title:house")], SCHEMA)
    assert perc.always_run == 0
    assert all(k[0] == "g" for k in perc.anchor("a") or ())
    assert perc.candidates({"loc": {"lat": -33.9, "lon": 151.2}}) == []
    assert perc.candidates({"loc": {"lat": 52.36, "lon": 4.9}, "title": "house"}) == ["a", "b"]


@pytest.mark.parametrize("query", [
    "title:geo_distance(1, 2, 3km)",          # not a geo_point field
    "loc:geo_distance(91, 2, 3km)",           # latitude out of range
    "loc:geo_distance(1, 2, 0km)",            # radius
    "loc:geo_box(1, 2, 3, 4)",                # top below bottom
    "loc:geo_distance(1, 2)",                 # malformed
    "loc:house",                              # a term on a geo_point field
])
def test_bad_geo_clauses_are_query_errors(query: str) -> None:
    with pytest.raises(QueryError):
        Percolator.from_searches([SavedSearch("a", "o", query)], SCHEMA)
