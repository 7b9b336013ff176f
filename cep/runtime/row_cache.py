"""The native store's appended log rows, shared by the worker processes of one machine.

Why (docs/spark-runtime.md, "A moved shard's rows from the machine's cache", session 16): with
two stateful tasks per micro-batch, Spark hands a shard to whichever Python worker of its pool is
free, so in most batches a shard's call runs in a process whose held copy is a row or two
behind, and `NativeShardStore._catch_up` reads those rows back through the state server, a
round trip per row of a few hundred KB (the bench input: ~430 KB per row at 20k-row batches,
~15 ms per row on the loaded 2-core machine, 60 % of the catch-up's time). The process that
appended the row wrote the same bytes a moment before. So a flush also writes what it
appended to a file on the machine (tmpfs where there is one), named by the token it produced,
and a catch-up takes its rows from there when the files chain from its own token to the
store's: the state store stays the authority, the files are a cache.

Why the chain is safe: a token is 8 random bytes made by one flush, which wrote the file named
by it (the rows it appended and the token it appended them onto) and the same rows and token
to the state store. A file is only used when the store's record names its token (or a later
file's predecessor does), walking back from the store's current token to the held copy's own:
every token on that walk was the store's record at some committed version (a rolled-back
flush's token is never named again: the re-run makes a new one), so the files' rows are the
store's rows. Anything missing, or a walk that does not land exactly on the held copy's token
and row, is a miss: the rows are read from the state store as before.

The files of a query live in one directory (`for_query`: its id, which a restart keeps), at
most `KEEP` per shard and `KEEP_BYTES` (the newest always; older ones are deleted by the flush
that writes a new one); a directory untouched for `STALE_S` is removed by the next query that
opens the cache (nothing else removes them: a stopped or killed job's files stay in memory
until then, or a reboot). The directory is the user's own (`_private`), and no file is written
on a nearly full file system (`FREE_PART`).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

MAGIC = b"CEPRC\x01"  # the file format: this magic (version 1), then the header and the rows
_SAFE = re.compile(r"[A-Za-z0-9_-]+")  # a file name of its own: no dot, no separator


class RowCache:
    """Files of appended rows under `root`, one directory per shard."""

    # Files kept per shard: a copy one or two calls behind is the usual catch-up at 2 stateful
    # tasks, but at low rates a shard can stay away from a process for several batches (a
    # batch of session 15's 5,000/s run read 36 rows for 6 shards). Bounded in bytes too: at
    # 60k-row batches a raw row is ~1.3 MB (stored compressed since layout 3: ~5x less).
    KEEP = 16
    KEEP_BYTES = 8 << 20
    STALE_S = 600.0
    # A file is not written when it would leave less than 1/FREE_PART of the file system free
    # (or FREE_MAX, on a big one): tmpfs is the machine's memory, and a container's /dev/shm
    # is often 64 MB that other programs need.
    FREE_PART = 4
    FREE_MAX = 1 << 30

    def __init__(self, root: Path) -> None:
        self.root = root
        self.hits = 0  # rows taken from the cache
        self.misses = 0  # catch-ups that read the state store

    @classmethod
    def for_query(cls, query_id: str | None, base: Path | None = None) -> RowCache | None:
        """The cache of a streaming query (None: no query id, or no usable directory)."""
        if not query_id or not _SAFE.fullmatch(query_id):
            return None
        base = base or default_base()
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(base):
                return None  # not ours (another user made it first): neither read nor written
            root = base / query_id
            if not root.exists():
                _drop_stale(base, cls.STALE_S)
                root.mkdir(exist_ok=True)
        except OSError:
            return None
        return cls(root)

    def _dir(self, shard: Any) -> Path:
        name = "-".join(str(p) for p in shard) if isinstance(shard, tuple) else str(shard)
        if not _SAFE.fullmatch(name):
            name = f"h{zlib.crc32(repr(shard).encode()):08x}"
        return self.root / name

    def put(self, shard: Any, token: bytes, prev: bytes, start: int, blobs: list[bytes]) -> None:
        """The rows `blobs`, appended at row `start` onto `prev`, which made `token`."""
        d = self._dir(shard)
        tmp = d / f".{token.hex()}.{os.getpid()}"
        try:
            # (parents: another query may have removed this one's directory as stale)
            d.mkdir(parents=True, exist_ok=True)
            parts = [MAGIC, len(prev).to_bytes(1, "little"), prev,
                     start.to_bytes(4, "little"), len(blobs).to_bytes(4, "little")]
            for b in blobs:
                parts += [len(b).to_bytes(4, "little"), b]
            data = b"".join(parts)
            fs = os.statvfs(d)
            if fs.f_bavail * fs.f_frsize - len(data) < min(
                    fs.f_blocks * fs.f_frsize // self.FREE_PART, self.FREE_MAX):
                return  # the file system is nearly full (tmpfs is the machine's memory)
            tmp.write_bytes(data)
            tmp.replace(d / token.hex())
            files = sorted(((p.stat(), p) for p in d.iterdir() if not p.name.startswith(".")),
                           key=lambda f: -f[0].st_mtime_ns)
            kept = 0
            for i, (st, p) in enumerate(files):
                kept += st.st_size
                if i >= self.KEEP or (i and kept > self.KEEP_BYTES):
                    p.unlink(missing_ok=True)
        except OSError:  # a cache: the next catch-up reads the state store
            tmp.unlink(missing_ok=True)  # (a write cut short: tmpfs full)

    def _read(self, shard: Any, token: bytes) -> tuple[bytes, int, list[bytes]] | None:
        try:
            raw = (self._dir(shard) / token.hex()).read_bytes()
        except OSError:
            return None
        if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 9:
            return None
        at = len(MAGIC)
        n = raw[at]
        prev = raw[at + 1:at + 1 + n]
        at += 1 + n
        start = int.from_bytes(raw[at:at + 4], "little")
        count = int.from_bytes(raw[at + 4:at + 8], "little")
        at += 8
        blobs = []
        for _ in range(count):
            size = int.from_bytes(raw[at:at + 4], "little")
            blobs.append(raw[at + 4:at + 4 + size])
            at += 4 + size
        if at != len(raw):
            return None  # not a whole file
        return prev, start, blobs

    def chain(self, shard: Any, held_token: bytes, held_rows: int, token: bytes,
              rows: int) -> list[bytes] | None:
        """The rows `held_rows`..`rows - 1` that took the store from `held_token` to `token`,
        when the files chain exactly from one to the other; else None."""
        got: list[list[bytes]] = []
        at_token, at_rows = token, rows
        while at_token != held_token or at_rows != held_rows:
            if at_rows <= held_rows or not at_token:
                self.misses += 1
                return None
            f = self._read(shard, at_token)
            if f is None or f[1] + len(f[2]) != at_rows:
                self.misses += 1
                return None
            got.append(f[2])
            at_token, at_rows = f[0], f[1]
        blobs = [b for part in reversed(got) for b in part]
        self.hits += len(blobs)
        return blobs


def default_base() -> Path:
    """A directory of this user's (`_private`) in `CEP_ROW_CACHE_DIR`, else in tmpfs (/dev/shm)
    when writable, else in the temp directory."""
    env = os.environ.get("CEP_ROW_CACHE_DIR")
    shm = Path("/dev/shm")  # noqa: S108 - a per-machine cache, in a directory only we can open
    parent = Path(env) if env else shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(
        tempfile.gettempdir())
    return parent / f"cep-rows-{os.getuid()}"


def _private(base: Path) -> bool:
    """`base` is a directory of this user's that no one else can read or write (/dev/shm is
    shared by the machine's users: another one could have made it first, to read the rows or
    put rows of its own under the names it sees)."""
    st = base.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return False
    if st.st_mode & 0o077:
        os.chmod(base, 0o700)  # ours, made before this check (or under another umask)
    return True


def _drop_stale(base: Path, stale_s: float) -> None:
    """Directories of queries that wrote nothing for `stale_s` seconds."""
    now = time.time()
    for d in base.iterdir():
        try:
            newest = max((p.stat().st_mtime for p in d.rglob("*")), default=d.stat().st_mtime)
            if now - newest > stale_s:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:
            continue
