"""The user's own frames: the innermost Python traceback frames, in the rank output, that are the
job's code rather than an installed package, the standard library or torch.

For an application error or an out-of-memory error the engineer wants the line in their own code
(`packed.py`, line 118), not the forty frames of the framework around it. The traceback printed
just before the root evidence line is read back from the evidence file (the reader keeps only
the lines that rules match) and its frames are filtered; output_lines.user_frames reads it from
a bundle.
"""
from __future__ import annotations

import re
from collections import deque
from typing import Optional

MAX_FRAMES = 3            # innermost user frames kept
LOOKBACK = 400            # lines before the error line searched for its traceback
BEFORE_OFFSET = 256 << 10  # bytes before the error line's offset read back when it has one
SCAN_CAP = 64 << 20       # bytes read from the start when only the line number is known

# `  File "/w/train.py", line 118, in step`, also after a `[rank3]:` or `node-01: 0:` prefix.
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>[^\s(]+)')
# Where one traceback ends and an earlier one (of a chained exception, another rank) begins.
STOP = re.compile(r"Traceback \(most recent call last\)|During handling of the above exception|"
                  r"The above exception was the direct cause")

_NOT_USER = re.compile(
    r"/(site|dist)-packages/"            # installed packages
    r"|/lib(64)?/python\d+(\.\d+)?/"      # the standard library
    r"|(^|/)torch/"                       # torch internals from a source checkout
    r"|^<")                               # <frozen importlib._bootstrap>, <string>


def is_user_file(path: str) -> bool:
    return not _NOT_USER.search(path)


def frames_before(lines: list[str]) -> list[dict]:
    """Frames of the traceback that ends at the last of `lines` (the error line): innermost
    first, only the user's own, at most MAX_FRAMES."""
    found: list[dict] = []
    for text in reversed(lines[:-1]):
        if STOP.search(text):
            break
        m = FRAME.search(text)
        if m:
            found.append({"file": m["file"], "line": int(m["line"]), "function": m["function"]})
    return [f for f in found if is_user_file(f["file"])][:MAX_FRAMES]


def lines_up_to(pread, line: Optional[int], offset: Optional[int]) -> list[str]:
    """The LOOKBACK lines that end with the error line (given by byte offset or line number).
    `pread(n, offset)` reads the file (or a view of it)."""
    if offset is not None:
        start = max(0, offset - BEFORE_OFFSET)
        data = pread(offset - start + (64 << 10), start)
        head, rest = data[:offset - start], data[offset - start:]
        text = head + rest.split(b"\n", 1)[0]
        lines = text.decode("utf-8", "replace").split("\n")
        return (lines[1:] if start else lines)[-LOOKBACK:]
    if not line:
        return []
    return frames_source_lines(pread, {line}).get(line, [])


def frames_source_lines(pread, wanted: set) -> dict:
    """For each line number in `wanted`: the LOOKBACK lines that end with it, in one pass
    from the start of the file (read at most SCAN_CAP bytes)."""
    out: dict = {}
    if not wanted:
        return out
    last: deque = deque(maxlen=LOOKBACK)
    top = max(wanted)
    read = pos = n = 0
    buf = b""
    while True:
        chunk = pread(8 << 20, pos)
        pos += len(chunk)
        if chunk:
            *lines, buf = (buf + chunk).split(b"\n")
        else:
            lines, buf = ([buf] if buf else []), b""
        for raw in lines:
            n += 1
            read += len(raw) + 1
            last.append(raw.decode("utf-8", "replace").rstrip("\r"))
            if n in wanted:
                out[n] = list(last)
                if n >= top:
                    return out
            if read > SCAN_CAP:
                return out
        if not chunk or len(buf) > SCAN_CAP:
            return out


def frames_at(pread, hits: list) -> list[list[dict]]:
    """The user's frames above each of `hits` ((line, offset) pairs, as the evidence points
    at them: by line number, or by offset when the line is past a cut), as `user_frames`
    would find them in the file `pread` reads. Files with no `File "` at all cost one pass."""
    found = False
    pos = 0
    tail = b""
    while not found:
        chunk = pread(8 << 20, pos)
        if not chunk:
            break
        found = b'File "' in tail + chunk
        tail = chunk[-8:]
        pos += len(chunk)
    if not found:
        return [[] for _ in hits]
    by_line = frames_source_lines(pread, {ln for ln, _ in hits if ln})
    return [frames_before(by_line.get(ln, [])) if ln else
            frames_before(lines_up_to(pread, None, off)) if off is not None else []
            for ln, off in hits]
