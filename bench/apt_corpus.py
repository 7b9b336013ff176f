"""A real text corpus for the percolator: Debian package descriptions, and saved searches drawn
from the corpus's own vocabulary (issue 17).

Events come from `apt-cache dumpavail` (the package lists `apt-get update` fetched) joined with
the long descriptions of apt's `Translation-en` lists by Description-md5 (dumpavail carries only
the short one; scripts/apt_corpus.sh fetches both), one per package name (the first stanza wins):

    {"package", "title" (short description), "body" (long description, lines joined by spaces),
     "section", "priority", "installed_size" (KiB, int), "maintainer", "version"}

`tests/percolator/data/apt_sample.txt.gz` is a committed sample of the same dump (a few thousand
packages) that tests and `--sample` runs use where the lists are not present.

Saved searches are generated the way Luwak / Lucene Monitor benchmarks do: from the corpus's own
terms at realistic frequencies. Term document frequencies (df) are counted over title + body;
query words are alphabetic, 3+ letters, and drawn from frequency bands so that a search matches
a handful of documents, and a typical document matches a few searches, not a thousand:

| share | shape |
|---|---|
| 30% | `body:a AND body:b` — two words of one document, each with df in the mid band |
| 15% | `body:"a b"` — an adjacent word pair of one document |
| 12% | `title:a` — a rarer title word |
| 10% | `body:a AND NOT body:b` — a mid-band word, minus a common one |
| 8%  | `body:abcdef*` — a prefix of a rare word (≥ 6 letters kept) |
| 8%  | `body:abcdefg~1` — fuzzy, a rare word of ≥ 7 letters |
| 7%  | `(title:a OR title:b) AND section:s` — boolean with a keyword field |
| 5%  | `body:a AND installed_size:[lo TO hi]` — numeric range |
| 5%  | `body:a AND body:b AND body:c` — three words of one document |

Every query is written so that our parser (luqum) and Lucene's classic QueryParser read it the
same way (explicit AND/OR/NOT, lowercase alphabetic words, sections without `/`).
"""

from __future__ import annotations

import bisect
import gzip
import random
import re
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from percolator import FieldType, SavedSearch, Schema
from percolator.terms import deletion_variants

SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "percolator" / "data" / \
    "apt_sample.txt.gz"
FIELDS = ("title", "body", "section", "priority", "installed_size")
SCHEMA = Schema({"title": FieldType.TEXT, "body": FieldType.TEXT,
                 "section": FieldType.KEYWORD, "priority": FieldType.KEYWORD,
                 "installed_size": FieldType.NUMBER, "package": FieldType.KEYWORD,
                 "maintainer": FieldType.TEXT, "version": FieldType.KEYWORD},
                default_fields=("title", "body"))
_WORD = re.compile(r"[a-z]{3,}")
_SPLIT = re.compile(r"[^0-9a-z]+")


class CorpusUnavailable(RuntimeError):
    pass


def dumpavail() -> str:
    """`apt-cache dumpavail` (empty when apt has no lists: run scripts/apt_corpus.sh)."""
    try:
        proc = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True,
                              timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CorpusUnavailable(f"apt-cache dumpavail failed: {e}") from e
    return proc.stdout


LISTS = Path("/var/lib/apt/lists")


def translations() -> str:
    """The long English descriptions (`Translation-en` lists, decompressed by apt-helper)."""
    out: list[str] = []
    for f in sorted(LISTS.glob("*_i18n_Translation-en*")):
        proc = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(f)],
                              capture_output=True, text=True, timeout=300, check=False)
        out.append(proc.stdout)
    return "\n\n".join(out)


def merge_translations(packages: str, trans: str) -> str:
    """A dumpavail whose Description fields carry the long text from `trans`."""
    long: dict[str, str] = {}
    for st in stanzas(trans):
        md5, desc = st.get("Description-md5"), st.get("Description-en")
        if md5 and desc:
            long[md5] = desc
    parts: list[str] = []
    for st in stanzas(packages):
        desc = long.get(st.get("Description-md5", ""))
        if desc is not None:
            st["Description"] = desc
        parts.append(_stanza_text(st))
    return "\n\n".join(parts) + "\n"


def _stanza_text(st: dict[str, str]) -> str:
    lines: list[str] = []
    for k, v in st.items():
        first, *rest = v.split("\n")
        lines.append(f"{k}: {first}")
        lines += [" " + x for x in rest]
    return "\n".join(lines)


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """RFC 822 stanzas of a dumpavail: field → value (continuation lines joined by '\n')."""
    cur: dict[str, str] = {}
    last = ""
    for line in text.splitlines():
        if not line.strip():
            if cur:
                yield cur
            cur, last = {}, ""
        elif line[0] in " \t":
            if last:
                cur[last] += "\n" + line[1:]
        else:
            name, _, value = line.partition(":")
            last = name
            cur[name] = value.strip()
    if cur:
        yield cur


def to_event(st: dict[str, str]) -> dict[str, Any] | None:
    desc = st.get("Description")
    if not desc or "Package" not in st:
        return None
    title, _, rest = desc.partition("\n")
    lines = [ln.strip() for ln in rest.split("\n")]
    body = " ".join(ln for ln in lines if ln and ln != ".")
    try:
        size = int(st.get("Installed-Size", "0"))
    except ValueError:
        size = 0
    return {"package": st["Package"], "title": _clean(title), "body": _clean(body),
            "section": st.get("Section", ""), "priority": st.get("Priority", ""),
            "installed_size": size, "maintainer": st.get("Maintainer", ""),
            "version": st.get("Version", "")}


def _clean(s: str) -> str:
    return s.replace("\t", " ").replace("\r", " ").replace("\n", " ").strip()


def events_from(text: str, limit: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for st in stanzas(text):
        ev = to_event(st)
        if ev is None or ev["package"] in seen:
            continue
        seen.add(ev["package"])
        out.append(ev)
        if limit is not None and len(out) >= limit:
            break
    return out


def load(source: str = "auto", limit: int | None = None) -> tuple[list[dict[str, Any]], str]:
    """(events, where from). source: "apt" (apt-cache dumpavail), "sample" (the committed
    sample), a path to a dumpavail file (.gz allowed), or "auto" (apt if it has lists, else
    the sample)."""
    if source in ("auto", "apt"):
        text = dumpavail()
        trans = translations() if text.strip() else ""
        if text.strip() and trans.strip():
            return (events_from(merge_translations(text, trans), limit),
                    "apt-cache dumpavail + Translation-en")
        if source == "apt":
            raise CorpusUnavailable("no apt lists with English descriptions: "
                                    "run scripts/apt_corpus.sh")
        source = str(SAMPLE)
    path = SAMPLE if source == "sample" else Path(source)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return events_from(raw.decode("utf-8", "replace"), limit), str(path)


def words(text: str) -> list[str]:
    """Lowercase alphabetic words the way both analysers see them (query vocabulary only)."""
    return [w for w in _SPLIT.split(text.lower()) if _WORD.fullmatch(w)]


def doc_freq(events: Iterable[dict[str, Any]], field: str) -> Counter[str]:
    df: Counter[str] = Counter()
    for ev in events:
        df.update(set(words(ev[field])))
    return df


def queries(events: list[dict[str, Any]], n: int, seed: int = 17) -> list[SavedSearch]:
    """`n` saved searches from the corpus vocabulary (see the module doc for the mix); each
    search's `metadata["kind"]` names its shape."""
    rng = random.Random(seed)
    n_docs = len(events)
    body_words = [words(ev["body"]) for ev in events]
    df_body: Counter[str] = Counter()
    for ws in body_words:
        df_body.update(set(ws))
    df_title = doc_freq(events, "title")
    # Bands scale with the corpus so that the sample and the full corpus behave alike.
    mid_lo, mid_hi = max(3, n_docs // 2000), max(10, n_docs // 250)
    rare_hi = max(3, n_docs // 6000)
    common = [w for w, _ in df_body.most_common(300)]
    vocab = sorted(df_body)
    rare_title = sorted(w for w, c in df_title.items() if 2 <= c <= rare_hi
                        and df_body[w] <= rare_hi)
    long_rare = sorted(w for w, c in df_body.items() if 2 <= c <= rare_hi and len(w) >= 9)

    def prefix_df(p: str) -> int:
        i = bisect.bisect_left(vocab, p)
        total = 0
        while i < len(vocab) and vocab[i].startswith(p):
            total += df_body[vocab[i]]
            i += 1
            if total > rare_hi * 3:
                break
        return total

    # A fuzzy word must not be one edit from a frequent word (a rare typo of a common word
    # would match thousands of documents): no shared single-deletion variant.
    frequent: set[str] = set()
    for w, c in df_body.items():
        if c > rare_hi:
            frequent |= deletion_variants(w, 1)
    fuzzy_words = [w for w in long_rare if not (deletion_variants(w, 1) & frequent)]
    prefixes = [w[:7] for w in long_rare if prefix_df(w[:7]) <= rare_hi * 3]
    sections = sorted({ev["section"] for ev in events if ev["section"] and "/" not in
                       ev["section"]})
    docs = [i for i, ws in enumerate(body_words) if len(ws) >= 8]
    out: list[SavedSearch] = []
    for i in range(n):
        r = rng.random()
        toks = body_words[rng.choice(docs)]
        mid = [w for w in dict.fromkeys(toks) if mid_lo <= df_body[w] <= mid_hi]
        q: str | None = None
        kind = "term"
        if r < 0.30 and len(mid) >= 2:
            a, b = rng.sample(mid, 2)
            q, kind = f"body:{a} AND body:{b}", "and2"
        elif 0.30 <= r < 0.45:
            pairs = [(a, b) for a, b in zip(toks, toks[1:], strict=False)
                     if a != b and df_body[a] <= mid_hi and df_body[b] <= mid_hi]
            if pairs:
                a, b = rng.choice(pairs)
                q, kind = f'body:"{a} {b}"', "phrase"
        elif 0.45 <= r < 0.57 and rare_title:
            q, kind = f"title:{rng.choice(rare_title)}", "title"
        elif 0.57 <= r < 0.67 and len(mid) >= 2:
            a, b = rng.sample(mid, 2)
            q, kind = f"body:{a} AND body:{b} AND NOT body:{rng.choice(common)}", "not"
        elif 0.67 <= r < 0.75 and prefixes:
            q, kind = f"body:{rng.choice(prefixes)}*", "prefix"
        elif 0.75 <= r < 0.83 and fuzzy_words:
            q, kind = f"body:{rng.choice(fuzzy_words)}~1", "fuzzy"
        elif 0.83 <= r < 0.90 and sections and rare_title:
            a, b = rng.choice(rare_title), rng.choice(rare_title)
            q, kind = (f"(title:{a} OR title:{b}) AND section:{rng.choice(sections)}",
                       "or_section")
        elif 0.90 <= r < 0.95 and len(mid) >= 2:
            a, b = rng.sample(mid, 2)
            lo = rng.choice((0, 10, 100, 1000, 10000))
            q, kind = (f"body:{a} AND body:{b} AND installed_size:[{lo} TO {lo * 10 + 50}]",
                       "range")
        elif r >= 0.95 and len(mid) >= 3:
            a, b, c = rng.sample(mid, 3)
            q, kind = f"body:{a} AND body:{b} AND body:{c}", "and3"
        if q is None:
            q, kind = f"body:{rng.choice(long_rare)}", "term"
        out.append(SavedSearch(f"q{i}", "bench", q, metadata={"kind": kind}))
    return out


def workload(n_queries: int, n_events: int, source: str = "auto", seed: int = 17
             ) -> tuple[list[SavedSearch], list[dict[str, Any]], Schema]:
    """(searches, events, schema): searches from the whole corpus's vocabulary, events its
    first `n_events` packages in a seeded shuffle (0 = all)."""
    events, _ = load(source)
    return queries(events, n_queries, seed), shuffled(events, n_events, seed), SCHEMA


def shuffled(events: list[dict[str, Any]], n: int, seed: int = 17) -> list[dict[str, Any]]:
    """The first `n` events (0 = all) of a seeded shuffle of the corpus."""
    order = list(events)
    random.Random(seed + 1).shuffle(order)
    return order[:n] if n else order


def write_tsv(events: list[dict[str, Any]], path: Path) -> None:
    """Events for the Lucene harness: title, body, section, priority, installed_size per line
    (the loader has already replaced tabs and line breaks by spaces)."""
    with path.open("w", encoding="utf-8") as f:
        for ev in events:
            f.write("\t".join(str(ev[k]) for k in FIELDS) + "\n")
