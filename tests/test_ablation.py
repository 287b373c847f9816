"""Ablation: delete the lines a diagnosis cites for its root cause and diagnose again. A careful
engine then names no cause (or finds the same one again from lines it did not cite): it never
names another cause from what is left, the symptoms, teardown and context around the proof.

The same procedure as ../shared/tools/ablate-cases, in process, over the project's own real
cases (tests/cases-real), its synthetic ones (tests/cases) and the shared corpora when they sit
beside the checkout. A synthetic case whose evidence genuinely holds a second cause is listed
in SECOND_CAUSE with that cause and why; nothing else may guess."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers import CASES, ROOT
from sattrib.analysis import analyze_folder
from sattrib.engine.taxonomy import FAMILY

CORPORA = (("real", ROOT / "tests" / "cases-real"), ("own", CASES),
           ("shared-real", ROOT.parent / "shared" / "cases-real"),
           ("shared", ROOT.parent / "shared" / "cases"))
ANSWER_FILES = {"expected.json", "source.md", "README.md", "INDEX.md"}

# (case id) -> (the second cause left after the cut, as family@node, and why it is genuine)
SECOND_CAUSE = {
    "shared/xid74_peers_first_gpu": (
        "nvlink@dgx-23", "dgx-23's own GPUs log fatal NVLink Xid 74s in the kernel a second "
        "later, the far end of the multi-node NVLink domain: kernel evidence of a fault there"),
}


def _cases() -> list[tuple[str, Path]]:
    out, seen = [], set()
    for label, root in CORPORA:
        if not root.is_dir():
            continue
        for case in sorted(p for p in root.iterdir() if p.is_dir()):
            if case.name in seen or not (case / "expected.json").is_file():
                continue
            seen.add(case.name)
            out.append((f"{label}/{case.name}", case))
    return out


CASE_LIST = _cases()


def _stage(case: Path, dest: Path) -> Path:
    shutil.copytree(case, dest, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in ANSWER_FILES
                                             and Path(d) == case])
    return dest


def _cut(dest: Path, d) -> int:
    """Delete the lines the root cause cites (root and confirming evidence, by path:line)."""
    ids = set(d.root_cause.evidence)
    cut: dict[str, set] = {}
    for e in d.evidence:
        if e.id in ids and e.path and isinstance(e.line, int) and e.line > 0:
            cut.setdefault(e.path, set()).add(e.line)
    n = 0
    for rel, lines in cut.items():
        p = dest / rel
        if not p.is_file() or p.is_symlink():
            continue
        data = p.read_bytes().split(b"\n")
        keep = [ln for i, ln in enumerate(data, 1) if i not in lines]
        n += len(data) - len(keep)
        p.write_bytes(b"\n".join(keep))
    return n


def _key(d) -> str:
    r = d.root_cause
    return f"{FAMILY[r.category]}@{(r.node or '').split('.')[0].lower() or None}"


@pytest.mark.parametrize("cid,case", CASE_LIST, ids=[c for c, _ in CASE_LIST])
def test_without_its_proof_the_engine_names_no_other_cause(cid, case, rules, tmp_path):
    dest = _stage(case, tmp_path / case.name)
    first = analyze_folder(dest, rules=rules)[0]
    if first.outcome.value != "attributed" or not _cut(dest, first):
        pytest.skip("not attributed, or its proof cites no line")
    second = analyze_folder(dest, rules=rules)[0]
    if second.outcome.value != "attributed" or _key(second) == _key(first):
        return                                   # holds, or the same cause from other lines
    allowed = SECOND_CAUSE.get(cid)
    assert allowed and allowed[0] == _key(second), (
        f"{cid}: with {_key(first)}'s proof deleted it names {_key(second)} "
        f"({second.root_cause.category.value}: {second.root_cause.summary})")


def test_every_listed_second_cause_is_a_case_that_runs():
    ids = {c for c, _ in CASE_LIST}
    assert not [c for c in SECOND_CAUSE if c.startswith("shared/") is False and c not in ids]
    for cid, (_, why) in SECOND_CAUSE.items():
        assert len(why) > 40, cid
        if (ROOT.parent / "shared" / "cases").is_dir() and cid.startswith("shared/"):
            assert cid in ids
            want = json.loads((ROOT.parent / "shared" / "cases" / cid.split("/", 1)[1]
                               / "expected.json").read_text())
            assert want["outcome"] == "attributed", cid
