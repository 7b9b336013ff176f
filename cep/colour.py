"""ANSI colour for the CLI's diagnostics, on a terminal only.

Colour is used when the stream is a TTY, unless NO_COLOR is set (no-color.org); FORCE_COLOR
forces it (for tests and pagers that understand it). Only the CLI calls this: rendered errors
stay plain text everywhere else (logs, JSON, the console)."""

from __future__ import annotations

import os
import re
from typing import TextIO

RED, CYAN, BOLD, RESET = "\x1b[31m", "\x1b[36m", "\x1b[1m", "\x1b[0m"
_HEAD = re.compile(r"^(\S.*?: )((?:syntax )?error|warning)(:)", re.MULTILINE)


def enabled(stream: TextIO) -> bool:
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("NO_COLOR"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def diagnostic(text: str, stream: TextIO) -> str:
    """A rendered `SourceError`: the kind in bold red, the caret line red, the hint cyan."""
    if not enabled(stream):
        return text
    out = []
    for line in text.splitlines():
        if line.strip() and set(line.strip()) == {"^"}:
            line = f"{RED}{line}{RESET}"
        elif line.startswith("  hint:"):
            line = f"{CYAN}{line}{RESET}"
        else:
            line = _HEAD.sub(lambda m: f"{m[1]}{BOLD}{RED}{m[2]}{RESET}{m[3]}", line)
        out.append(line)
    return "\n".join(out)
