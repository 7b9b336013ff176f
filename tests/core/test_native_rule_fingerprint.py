"""A native key state names each rule's part by a 32-bit fingerprint of the rule's id and version
(`keycodec::fingerprint`, FNV-1a): two rules of one engine with the same fingerprint would read
each other's state (one rule took the other's partial match and its match was lost), so the
engine refuses to be built, naming both rules.

The colliding pair is found here by a birthday search over generated rule ids (FNV-1a
reimplemented below; the error message, which names the pair, checks it agrees with the core's).
"""

from __future__ import annotations

import pytest

from cep.compile import compile_rules
from cep.runtime.bind import build_embedded_engine, rule_hash

TEXT = """STREAM s TIME BY ts LATENESS 0ms;
RULE {0} FROM s PARTITION BY k PATTERN (a -> b) DEFINE a AS t = 'a', b AS t = 'b'
  WITHIN 100ms EMIT 'ab';
RULE {1} FROM s PARTITION BY k PATTERN (x -> y) DEFINE x AS t = 'x', y AS t = 'y'
  WITHIN 100ms EMIT 'xy';
"""


def fnv1a(h: int, data: bytes) -> int:
    for b in data:
        h = ((h ^ b) * 0x0100_0193) & 0xFFFF_FFFF
    return h


def fingerprint(rule_id: str, version: str) -> int:
    """keycodec::fingerprint: FNV-1a of the id, a 0xff byte and the version."""
    return fnv1a(fnv1a(fnv1a(0x811C_9DC5, rule_id.encode()), b"\xff"), version.encode())


def colliding_ids() -> tuple[str, str]:
    """Ids `p<n>` for the first rule and `q<m>` for the second whose fingerprints (with each
    rule's version: its content hash, which does not depend on its id) are equal."""
    rules = compile_rules(TEXT.format("p", "q"), "fp.cep").rules
    v1, v2 = rule_hash(rules[0]), rule_hash(rules[1])
    firsts = {fingerprint(f"p{n}", v1): f"p{n}" for n in range(100_000)}
    for m in range(10_000_000):  # ~43k tries expected (2**32 / 100k)
        hit = firsts.get(fingerprint(f"q{m}", v2))
        if hit is not None:
            return hit, f"q{m}"
    raise AssertionError("no colliding pair found")


def test_rules_with_colliding_fingerprints_are_refused() -> None:
    a, b = colliding_ids()
    ruleset = compile_rules(TEXT.format(a, b), "fp.cep")
    assert [rule_hash(r) for r in ruleset.rules] == [
        rule_hash(r) for r in compile_rules(TEXT.format("p", "q"), "fp.cep").rules]
    for families in (True, False):
        with pytest.raises(ValueError, match=rf"rules '{a}' and '{b}' have the same key-state "
                                             "fingerprint"):
            build_embedded_engine(ruleset, use_native=True, families=families)
    # Without the collision (one id changed) the same rules build.
    assert build_embedded_engine(compile_rules(TEXT.format(a, b + "x"), "fp.cep"),
                                 use_native=True) is not None
