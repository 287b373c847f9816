"""Slurm hostlist expressions: `gpu-a[017-024,030],login1` <-> node names."""
from __future__ import annotations

import re

_MAX_HOSTS = 100_000


def expand(expr: str) -> list[str]:
    """Expand a Slurm hostlist; malformed parts are returned as written."""
    out: list[str] = []
    for part in _split_top(expr or ""):
        out.extend(_expand_one(part))
        if len(out) > _MAX_HOSTS:
            break
    return out


def _split_top(expr: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in expr.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip() and p.strip() != "(null)"]


def _expand_one(part: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", part)
    if not m:
        return [part]
    prefix, body, rest = m.groups()
    tails = _expand_one(rest) if rest else [""]
    out = []
    for rng in body.split(","):
        if "-" in rng:
            a, b = rng.split("-", 1)
            if not (a.isdigit() and b.isdigit()) or int(b) - int(a) > _MAX_HOSTS:
                return [part]
            width = len(a)
            out.extend(f"{prefix}{str(i).zfill(width)}" for i in range(int(a), int(b) + 1))
        elif rng.isdigit():
            out.append(prefix + rng)
        else:
            return [part]
    return [h + t for h in out for t in tails]


def compress(hosts: list[str]) -> str:
    """Inverse of expand for display: `node-01,node-02,node-04` -> `node-[01-02,04]`."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for h in sorted(set(hosts)):
        m = re.match(r"^(.*?)(\d+)$", h)
        if not m:
            plain.append(h)
            continue
        groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
    parts = []
    for (prefix, width), nums in sorted(groups.items()):
        nums.sort()
        runs, start, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(str(start).zfill(width) if start == prev
                        else f"{str(start).zfill(width)}-{str(prev).zfill(width)}")
            if n is not None:
                start = prev = n
        parts.append(prefix + runs[0] if len(runs) == 1 and "-" not in runs[0]
                     else f"{prefix}[{','.join(runs)}]")
    return ",".join(parts + plain)
