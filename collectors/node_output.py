"""A node's own ranks' output, scanned where it was written (the Epilog's side of
collectors/output_lines.py): the evidence reader runs on the node's files as the job's user and
what it keeps is shipped in the snapshot as `.lines` extracts, instead of the controller copying
the bytes."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..engine.rules import load_rules
from .evidence_folder import FolderReader
from .output_lines import extract
from .reader import Limits
from .slurm_job import in_child

MAX_SHIP = 64 << 20            # characters of extracts one node ships in its snapshot


def ship(paths: list, owner: Optional[int], cap: int, limits: Limits, rules_dirs: list,
         deadline: float, gid: Optional[int] = None) -> tuple[list, list]:
    """What a node's Epilog ships for its own output files: (outputs, notes), outputs being
    [{"source", "lines"}]. The rules load (as root) and every file is read (as the job's user
    `owner`, `gid`: reader.become) in a child process killed at the deadline
    (slurm_job.in_child); a file not finished by then, or past MAX_SHIP, is left to the
    controller, which copies it."""
    state: dict = {}

    def setup() -> None:
        rules = load_rules([Path(d) for d in rules_dirs], lenient_site=True)
        state.update(reader=FolderReader(rules, limits=limits), version=rules.version)

    def work(i: int) -> dict:
        return extract(paths[i], owner, cap, state["reader"], state["version"])

    notes: list = []
    try:
        done, timed_out = in_child(len(paths), work, deadline, as_user=(owner, gid),
                                   setup=setup)
    except OSError as e:
        return [], [f"job output not read on the node: cannot start the reader ({e.strerror})"]
    outputs, total, left = [], 0, 0
    for i in range(len(paths)):
        got = done.get(i)
        if got is None or got.get("lines") is None:
            left += got is None
            notes.extend((got or {}).get("notes") or [])
            continue
        total += len(got["lines"])
        if total > MAX_SHIP:
            left += 1
            continue
        outputs.append({"source": got["source"], "lines": got["lines"]})
    if left:
        notes.append(f"{left} of {len(paths)} output files left to the controller ("
                     + ("the Epilog's deadline came first)" if timed_out else
                        f"more than {MAX_SHIP >> 20} MiB of extracts)"))
    return outputs, notes
