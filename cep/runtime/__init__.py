"""Runtime: the matcher core (`matcher`) and the event-time engine (`engine`).

Nothing here imports pyparsing or the grammar: the runtime runs compiled `cep.nfa` objects.
"""

from cep.runtime.matcher import (
    DEFAULT_MAX_PARTIAL_MATCHES,
    Dropped,
    Match,
    MatchedEvent,
    Matcher,
    MatcherStats,
    Result,
    State,
    Timeout,
)

__all__ = [
    "DEFAULT_MAX_PARTIAL_MATCHES",
    "Dropped",
    "Match",
    "MatchedEvent",
    "Matcher",
    "MatcherStats",
    "Result",
    "State",
    "Timeout",
]
