"""Rank output read where it was written: a node scans its own ranks' files and ships the lines.

At 1,024 nodes x 8 ranks x 1.5 MB the controller would copy and read 12 GB. Where the job's
output is per node (`%N` or `%n` in its StdOut/StdErr pattern, or in `extra_output_globs`),
each node's Epilog runs the evidence reader on the files of its own node instead: the same
trust rules (`open_regular`: no symbolic links, no FIFOs, owned by the job's user), the same
cut the controller's copy makes (head and tail within `output_cap_mb`), the same per-file
budget (`Limits`) and the same prefilter and rule confirmation. What it keeps is written as a
`.lines` file, one JSON value per line:

    {"format": "sattrib-lines/1", "rules": "sha256:...", "budget": {...}, "size": ..., ...}
    {"o": 1234, "n": 17, "t": "the line", "l": ["rule.id"], "p": [...], "x": [...], ...}

the header, then one record per kept line: its byte offset (`o`) and line number (`n`, null
past a cut) in the file, its text (`t`), the rules whose literals hit and that matched (`l`),
the starts of the lines before (`p`, nearest first) and after (`x`) it for time stamps (only
where the reader may bound the line's time by them), the
lines that follow it for rules that read on (`f`), and the user's own traceback frames above it
(`u`, collectors/frames.py). The controller puts it in the evidence folder as
`logs/output-NNN.txt.lines`; the folder reader replays it into exactly the lines a scan of
`logs/output-NNN.txt` would give (the document keeps that name), so the diagnosis is the same
byte for byte. A node's file is used only when it was made with the controller's own rules and
budget; anything a node did not ship is copied by the controller as before.

A `.lines` file is job output, like the file it stands for, and is read as untrusted input:
bounded in size and record count, a record that does not have the expected shape is skipped
with a note.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Optional

from ..engine.lineparse import HOST, SRUN
from .frames import frames_at, innermost, lines_around, with_exception
from .reader import Limits, RawHit, SkipFile, open_regular, open_under, read_head

FORMAT = "sattrib-lines/1"
SUFFIX = ".lines"
HEADER_START = b'{"format": "sattrib-lines/'
MAX_BYTES = 128 << 20          # of one .lines file read back
MAX_TEXT = 64 << 10            # characters of one string in a record
MAX_LIST = 64                  # entries in one record's list


def budget(limits: Limits, output_cap: int) -> dict:
    """What decides which lines a scan keeps: the reader's limits and the copy's cap."""
    return dict(dataclasses.asdict(limits), output_cap=output_cap)


def copy_view(fd: int, size: int, cap: int):
    """(pread, size, cut note) of the copy the controller would make of this file: the file
    itself up to `cap`, else its first and last cap/2 bytes back to back (slurm_job.copy_output).
    pread is None when the copy is the whole file."""
    if size <= cap:
        return None, size, None
    half = cap // 2

    def pread(n: int, off: int) -> bytes:
        out = []
        while n > 0 and off < 2 * half:
            where = off if off < half else size - half + (off - half)
            take = min(n, (half if off < half else 2 * half) - off)
            data = os.pread(fd, take, where)
            if not data:
                break
            out.append(data)
            off += len(data)
            n -= len(data)
        return b"".join(out)
    return pread, 2 * half, f"{size} bytes, kept the first and last {half} bytes"


def extract(src: str, owner: Optional[int], cap: int, reader, rules_version: str) -> dict:
    """Scan one rank output file as the controller would scan its copy. Returns
    {"source", "lines": text of the .lines file or None, "notes": [...]}: None when the file
    is not this node's to ship (the controller then copies it and says why, as before)."""
    out = {"source": src, "lines": None, "notes": []}
    try:
        fd, st = open_regular(src, owner=owner)
    except SkipFile:
        return out                 # the controller's copy notes it, in its words
    try:
        pread, size, cut = copy_view(fd, st.st_size, cap)
        gz = os.pread(fd, 2, 0) == b"\x1f\x8b"
        if gz and pread is not None:
            return out             # a cut gzip stream: left to the controller
        n = max(reader.lim.sniff_bytes, 16384)
        head = read_head(fd, n) if pread is None else pread(n, 0)
        res, tags = reader.scan_output(fd, size, head[:reader.lim.sniff_bytes], pread)
        whole = pread or (lambda n, off: os.pread(fd, n, off))
        frames = ([[] for _ in res.hits] if gz else
                  frames_at(whole, [(h.line, h.offset if h.line is None else None)
                                    for h in res.hits]))
    except OSError as e:
        out["notes"].append(f"{src}: not read on the node ({e.strerror})")
        return out
    finally:
        os.close(fd)
    header = {"format": FORMAT, "rules": rules_version, "budget": budget(reader.lim, cap),
              "source": src, "size": size, "cut": res.cut, "tags": tags, "notes": res.notes,
              "stamps": reader.stamped_head(head),
              "copy_note": f"{src}: {cut}" if cut else None, "hits": len(res.hits)}
    rows = [json.dumps(header, sort_keys=False)]
    for h, fr in zip(res.hits, frames):
        rec = {"o": h.offset, "n": h.line, "t": _text(h.data), "l": sorted(h.lits)}
        if reader.needs_neighbours(h):
            rec.update(p=[_text(b) for b in h.prev], x=[_text(b) for b in h.next])
        if h.following:
            rec["f"] = [_text(b) for b in h.following]
        if fr:
            rec["u"] = fr
        rows.append(json.dumps(rec, ensure_ascii=False))
    out["lines"] = "\n".join(rows) + "\n"
    return out


def _text(b: bytes) -> str:
    # Every reader of these bytes decodes them so: the text gives back the same string.
    return b.decode("utf-8", "replace")


@dataclasses.dataclass
class Replay:
    header: dict
    hits: list
    frames: dict                   # (line, offset) -> frames
    notes: list


def is_lines(head: bytes) -> bool:
    return head.startswith(HEADER_START)


def parse(data: bytes) -> Optional[Replay]:
    """A .lines file -> its header and RawHits; None when it is not one. Never raises."""
    first, _, rest = data.partition(b"\n")
    try:
        header = json.loads(first)
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        return None
    notes = [n[:1000] for n in header.get("notes") if isinstance(n, str)][:MAX_LIST] \
        if isinstance(header.get("notes"), list) else []
    for key in ("size", "cut"):
        if type(header.get(key)) is not int or header[key] < 0:
            header[key] = 0
    # How the file's lines are tagged (lineparse.tagging); a node may be of the release before,
    # which said only whether srun's task numbers tag them.
    tags = header.get("tags", SRUN if header.get("srun") is True else "")
    header["tags"] = tags if tags in (SRUN, HOST) else ""
    stamps = header.get("stamps")
    header["stamps"] = [x[:16384] for x in stamps[:50] if isinstance(x, str)] \
        if isinstance(stamps, list) else []
    hits, frames, bad = [], {}, 0
    for raw in rest.split(b"\n"):
        if not raw.strip():
            continue
        try:
            h, fr = _record(json.loads(raw))
        except (ValueError, TypeError, KeyError):
            bad += 1
            continue
        hits.append(h)
        if fr:
            frames[(h.line, h.offset if h.line is None else None)] = fr
    if bad:
        notes.append(f"{bad} unreadable records in the node's extract skipped")
    return Replay(header, hits, frames, notes)


def _strs(v, limit: int = MAX_TEXT) -> list:
    if not isinstance(v, list) or len(v) > MAX_LIST or not all(isinstance(x, str) for x in v):
        raise ValueError("not a list of strings")
    return [x[:limit] for x in v]


def _record(rec) -> tuple[RawHit, list]:
    if not isinstance(rec, dict):
        raise ValueError("not an object")
    off, line, text = rec["o"], rec.get("n"), rec["t"]
    if not (type(off) is int and off >= 0 and (line is None or (type(line) is int and line > 0))
            and isinstance(text, str)):
        raise ValueError("bad position or text")
    lits = set(_strs(rec["l"], 200))
    if not lits:
        raise ValueError("no rules")
    h = RawHit(offset=off, line=line, data=text[:MAX_TEXT].encode("utf-8", "replace"), lits=lits,
               prev=[s.encode() for s in _strs(rec.get("p", []))],
               next=[s.encode() for s in _strs(rec.get("x", []))],
               following=[s.encode() for s in _strs(rec.get("f", []))])
    frames = []
    for f in rec.get("u") or []:
        if (isinstance(f, dict) and isinstance(f.get("file"), str) and type(f.get("line")) is int
                and isinstance(f.get("function"), str)) and len(frames) < 8:
            frames.append({"file": f["file"][:4096], "line": f["line"],
                           "function": f["function"][:1024],
                           **({"exception": f["exception"][:1024]}
                              if isinstance(f.get("exception"), str) else {})})
    return h, frames


def read(fd: int) -> Optional[Replay]:
    """Read and parse an open .lines file, at most MAX_BYTES of it (whole records only)."""
    data = os.pread(fd, MAX_BYTES + 1, 0)
    cut = len(data) > MAX_BYTES
    if cut:
        data = data[:data.rfind(b"\n", 0, MAX_BYTES) + 1]
    rep = parse(data)
    if rep is not None and cut:
        rep.notes.append(f"the node's extract is larger than {MAX_BYTES >> 20} MiB: "
                         "records past that not read")
    return rep


def _shipped(folder: Path, path: str, line: Optional[int], offset: Optional[int],
             owner: Optional[int]) -> list[dict]:
    """The frames a node found above that line, from its extract `path.lines`."""
    fd = open_under(folder, path + ".lines", owner)
    if fd is None:
        return []
    try:
        rep = read(fd)
    except OSError:
        return []
    finally:
        os.close(fd)
    return rep.frames.get((line, offset), []) if rep else []


def user_frames(folder: Path, path: str, line: Optional[int], offset: Optional[int],
                owner: Optional[int] = None) -> list[dict]:
    """The user's frames of the innermost traceback behind the error line at `path` (relative
    to `folder`), the first one with the innermost exception line (`exception`) when that is
    not the error line itself: read back from the file, or, where a node shipped its extract
    instead, from the extract.
    Nothing when the file cannot be read safely or holds no Python traceback there."""
    if not path or ".." in Path(path).parts:
        return []
    if not os.path.lexists(folder / path) and os.path.lexists(folder / (path + ".lines")):
        return _shipped(folder, path, line, offset, owner)
    fd = open_under(folder, path, owner)
    if fd is None:
        return []
    try:
        if os.pread(fd, 2, 0) == b"\x1f\x8b":
            return []                      # compressed: a traceback there is not read back
        return with_exception(*innermost(*lines_around(lambda n, off: os.pread(fd, n, off),
                                                       line, offset)))
    except OSError:
        return []
    finally:
        os.close(fd)
