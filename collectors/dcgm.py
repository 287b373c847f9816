"""NVIDIA DCGM's view of the node's GPUs: `dcgmi health -c` where DCGM is installed, read line by
line by the rules that trust the `dcgm` source."""
from __future__ import annotations

import re
import shutil
from typing import TYPE_CHECKING

from . import probe

if TYPE_CHECKING:
    from .node_snapshot import Take

NAME = "dcgm.txt"
PROBE = "dcgmi"
_DCGM = re.compile(r"(Health Monitor Report|dcgmi |DCGM|\| Diagnostic)")


def sniff(text: str) -> bool:
    """`dcgmi health -c` / `dcgmi diag` / `dcgmi stats` text."""
    return bool(_DCGM.search(text[:4096]))


def take(ctx: Take) -> dict[str, str]:
    if not shutil.which(PROBE):
        return {}
    d = probe.run(PROBE, [PROBE, "health", "-c"], ctx.deadline(), max_bytes=1 << 20)
    ctx.probes.append(d.record())
    return {NAME: d.out.decode("utf-8", "replace")} if d.ok or d.out else {}
