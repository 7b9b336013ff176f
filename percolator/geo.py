"""Geo queries on `geo_point` fields (issue 17): distance from a point and bounding boxes.

Syntax (an extension cut out before luqum, like similarity):

    location:geo_distance(52.37, 4.89, 10km)          # within 10 km of (lat, lon); m, km, mi
    location:geo_box(52.5, 4.7, 52.2, 5.1)            # top lat, left lon, bottom lat, right lon

As Elasticsearch: distance is the arc (haversine) on a sphere of mean radius 6,371,008.8 m; a box
whose left longitude is greater than its right crosses the antimeridian; edges are inclusive.
Event values of a `geo_point` field: `{"lat": .., "lon": ..}`, `[lon, lat]` (GeoJSON order),
`"lat,lon"`, or a list of those.

The presearcher keys a geo clause on grid cells: at level k the world is 2^k × 2^k cells of
360/2^k degrees of longitude by 180/2^k of latitude; a clause takes the finest level at which its
bounding box covers at most `MAX_CELLS` cells, and an event point produces its cell at each level
in use. A point in the clause's region lies in its bounding box, hence in one of its cells.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

EARTH_RADIUS_M = 6_371_008.8
MAX_LEVEL = 24
MAX_CELLS = 16
UNITS = {"m": 1.0, "km": 1000.0, "mi": 1609.344}
_PAD = 1e-9  # degrees added around a bounding box against rounding

Box = tuple[float, float, float, float]  # top, left, bottom, right


def haversine_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    p1, p2 = math.radians(lat1), math.radians(lat2)
    dp, dl = p2 - p1, math.radians(lon2 - lon1)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


def in_box(lat: float, lon: float, box: Box) -> bool:
    top, left, bottom, right = box
    if not bottom <= lat <= top:
        return False
    if left <= right:
        return left <= lon <= right
    return lon >= left or lon <= right


def circle_box(lat: float, lon: float, meters: float) -> Box:
    """The bounding box of a spherical cap (Matuschek's method): exact, padded slightly."""
    r = meters / EARTH_RADIUS_M
    la = math.radians(lat)
    lo_lat, hi_lat = la - r, la + r
    if hi_lat >= math.pi / 2 or lo_lat <= -math.pi / 2 or r >= math.pi / 2:
        return (min(90.0, math.degrees(hi_lat) + _PAD), -180.0,
                max(-90.0, math.degrees(lo_lat) - _PAD), 180.0)
    dlon = math.degrees(math.asin(min(1.0, math.sin(r) / math.cos(la)))) + _PAD
    left, right = lon - dlon, lon + dlon
    if right - left >= 360:
        left, right = -180.0, 180.0
    else:
        left = left + 360 if left < -180 else left
        right = right - 360 if right > 180 else right
    return (math.degrees(hi_lat) + _PAD, left, math.degrees(lo_lat) - _PAD, right)


def cell(lat: float, lon: float, level: int) -> tuple[int, int, int]:
    n = 1 << level
    ix = min(n - 1, max(0, int((lon + 180.0) / 360.0 * n)))
    iy = min(n - 1, max(0, int((lat + 90.0) / 180.0 * n)))
    return (level, ix, iy)


def _spans(box: Box) -> list[tuple[float, float]]:
    _, left, _, right = box
    return [(left, right)] if left <= right else [(left, 180.0), (-180.0, right)]


def box_cells(box: Box) -> tuple[tuple[int, int, int], ...]:
    """The cells (at one level) covering `box`: the finest level with at most MAX_CELLS."""
    top, _, bottom, _ = box
    best: tuple[tuple[int, int, int], ...] = ((0, 0, 0),)
    for level in range(1, MAX_LEVEL + 1):
        cells: list[tuple[int, int, int]] = []
        _, _, y0 = cell(bottom, 0.0, level)
        _, _, y1 = cell(top, 0.0, level)
        for lo, hi in _spans(box):
            _, x0, _ = cell(0.0, lo, level)
            _, x1, _ = cell(0.0, hi, level)
            cells.extend((level, x, y) for x in range(x0, x1 + 1) for y in range(y0, y1 + 1))
            if len(cells) > MAX_CELLS:
                break
        if len(cells) > MAX_CELLS:
            break
        best = tuple(cells)
    return best


# Literal patterns (tests/test_architecture.py): a number is [+-]?\d+(?:\.\d+)?
DISTANCE_RE = re.compile(
    r"geo_distance\(\s*([+-]?\d+(?:\.\d+)?)\s*,\s*([+-]?\d+(?:\.\d+)?)\s*,"
    r"\s*([+-]?\d+(?:\.\d+)?)\s*(km|mi|m)?\s*\)")
BOX_RE = re.compile(
    r"geo_box\(\s*([+-]?\d+(?:\.\d+)?)\s*,\s*([+-]?\d+(?:\.\d+)?)\s*,"
    r"\s*([+-]?\d+(?:\.\d+)?)\s*,\s*([+-]?\d+(?:\.\d+)?)\s*\)")


def parse_point(value: Any) -> tuple[float, float] | None:
    """(lat, lon) of one geo_point value, or None if it is not one."""
    lat: Any
    lon: Any
    if isinstance(value, Mapping):
        lat, lon = value.get("lat"), value.get("lon")
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        lon, lat = value
    elif isinstance(value, str) and value.count(",") == 1:
        a, b = value.split(",")
        try:
            lat, lon = float(a), float(b)
        except ValueError:
            return None
    else:
        return None
    if isinstance(lat, bool) or isinstance(lon, bool):
        return None
    if not isinstance(lat, (int, float)) or not isinstance(lon, (int, float)):
        return None
    lat, lon = float(lat), float(lon)
    if not (-90.0 <= lat <= 90.0 and -180.0 <= lon <= 180.0):
        return None
    return (lat, lon)


def points(event: Mapping[str, Any], path: str) -> list[tuple[float, float]]:
    """Every geo_point under the dotted `path` of the raw event (lists of objects merge)."""
    out: list[tuple[float, float]] = []
    for v in _at(event, path.split(".")):
        p = parse_point(v)
        if p is not None:
            out.append(p)
        elif isinstance(v, (list, tuple)):
            for item in v:
                q = parse_point(item)
                if q is not None:
                    out.append(q)
    return out


def _at(value: Any, parts: list[str]) -> Iterator[Any]:
    if not parts:
        yield value
        return
    if isinstance(value, Mapping):
        if parts[0] in value:
            yield from _at(value[parts[0]], parts[1:])
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, Mapping):
                yield from _at(item, parts)
