"""Hypothesis example counts scaled by a profile, so one suite serves three loops.

`HYPOTHESIS_PROFILE` picks the profile (registered in tests/conftest.py):
- `dev`: the inner loop (`make test-fast`): a sixth of the CI count, at least 10;
- `ci`: the default and `make test`: the count each test states;
- `deep`: long runs (`HYPOTHESIS_PROFILE=deep pytest ...`): ten times the CI count.

A test states its CI count once: `@settings(max_examples=examples(300), ...)`.
"""

from __future__ import annotations

import os

PROFILES = ("dev", "ci", "deep")


def profile() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    if name not in PROFILES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def examples(ci: int) -> int:
    """The number of examples for a test that runs `ci` examples in CI."""
    name = profile()
    if name == "dev":
        return max(10, ci // 6)
    if name == "deep":
        return ci * 10
    return ci
