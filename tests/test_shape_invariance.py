"""The same evidence in another shape gives the same diagnosis.

Every real case (tests/cases-real, ../shared/cases-real, ../shared/cases) is rewritten by
tests/shapes.py into each shape a real emitter could have printed the same evidence in, and
analysed again: outcome, root-cause category, culprit node (under the new names, for renamed
nodes), GPU and rank must not change. A shape that drops what the diagnosis may need (the
clock that orders a log against the other files, the rank a prefix carried) is held to less:
no confident wrong answer. Big cases are run in two shapes each, a different two per case, so
that the file stays within a minute on two cores.
"""
from __future__ import annotations

import functools
import hashlib
from datetime import datetime, timezone
from pathlib import Path

import pytest

import shapes
from helpers import ROOT
from sattrib.analysis import analyze_folder
from test_real_cases import verdict

# The (case, shape) pairs whose diagnosis changes today, each with the mechanism that changes
# it. They run as strict xfails: when a mechanism is fixed its pairs pass, fail the run, and are
# removed from here.
XFAIL: dict[tuple[str, str], str] = {}

CORPORA = (("real", ROOT / "tests" / "cases-real"),
           ("shared-real", ROOT.parent / "shared" / "cases-real"),
           ("shared", ROOT.parent / "shared" / "cases"))
HEAVY_BYTES = 100_000          # a case this big takes ~0.3 s to analyse: sampled
HEAVY_SHAPES = 2


def _corpus() -> dict[str, Path]:
    """Case id -> folder; a case copied into two corpora is run once, under its first id."""
    out, seen = {}, set()
    for label, root in CORPORA:
        if not root.is_dir():
            continue
        for path in sorted(p for p in root.iterdir() if (p / "expected.json").is_file()):
            digest = hashlib.sha256()
            for f in sorted(path.rglob("*")):
                if f.is_file() and f.name not in shapes.ANSWER_FILES:
                    digest.update(f.relative_to(path).as_posix().encode() + f.read_bytes())
            if digest.digest() not in seen:
                seen.add(digest.digest())
                out[f"{label}/{path.name}"] = path
    return out


CASES = _corpus()


@functools.cache
def _case(cid: str) -> shapes.Case:
    return shapes.load(CASES[cid])


def _shapes_of(case: shapes.Case, heavy_index: int) -> list[str]:
    if case.size <= HEAVY_BYTES:
        return shapes.applicable(case)
    names = list(shapes.SHAPES)
    start = heavy_index * HEAVY_SHAPES
    picked = []
    for name in names[start % len(names):] + names[:start % len(names)]:
        if len(picked) < HEAVY_SHAPES and shapes.applies(case, name):
            picked.append(name)
    return picked


def _params():
    heavy = 0
    for cid in CASES:
        case = _case(cid)
        for shape in _shapes_of(case, heavy):
            why = XFAIL.get((cid, shape))
            marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
            yield pytest.param(cid, shape, id=f"{cid}:{shape}", marks=marks)
        heavy += case.size > HEAVY_BYTES


_BASE: dict = {}


def _analyze(variant: shapes.Variant, name: str, rules, tmp: Path):
    return analyze_folder(variant.write(tmp / variant.shape / name), rules=rules)[0]


def _baseline(cid: str, case: shapes.Case, rules, tmp: Path):
    """The diagnosis of the case as it is (its evidence only), once per case."""
    if cid not in _BASE:
        _BASE[cid] = _analyze(shapes.Variant("original", case.files), case.root.name, rules, tmp)
    return _BASE[cid]


def _cited(d) -> set:
    """(path, line) of the lines the causes cite, else the symptoms': where a progress bar is
    glued."""
    ev = {e.id: e for e in d.evidence}
    causes = ([d.root_cause] if d.root_cause else []) + list(d.candidates)
    ids = [i for c in causes for i in c.evidence] or [i for s in d.symptoms for i in s.evidence]
    return {(ev[i].path, ev[i].line) for i in ids[:4] if i in ev and ev[i].line}


def _named(d) -> set:
    causes = ([d.root_cause] if d.root_cause else []) + list(d.candidates)
    return {c.node for c in causes if c.node} | set(d.affected_nodes)


def _key(d, rename: dict) -> tuple:
    rc = d.root_cause
    if rc is None:
        return (d.outcome.value,)
    return (d.outcome.value, rc.category.value, rename.get(rc.node, rc.node), rc.gpu)


def _show(d) -> str:
    rc = d.root_cause
    if rc is None:
        return d.outcome.value + "".join(f" {c.category.value}@{c.node}" for c in d.candidates)
    return f"{rc.category.value}@{rc.node} gpu={rc.gpu} rank={rc.rank}"


PARAMS = list(_params())


def test_every_expected_failure_names_a_pair_that_runs():
    """A listed pair that is no longer run (a case renamed, a shape gone) would hide nothing;
    pairs of a corpus that is not here (../shared) are left out."""
    run = {tuple(p.values) for p in PARAMS}
    assert not {pair for pair in XFAIL if pair[0] in CASES} - run


@pytest.mark.parametrize(("cid", "shape"), PARAMS)
def test_the_diagnosis_does_not_depend_on_the_shape(cid, shape, rules, tmp_path):
    case = _case(cid)
    base = _baseline(cid, case, rules, tmp_path)
    v = shapes.make(case, shape, focus=_cited(base), names=_named(base))
    if v is None:
        pytest.skip("nothing in the case to rewrite in this shape")
    got = _analyze(v, case.root.name, rules, tmp_path)
    said = f"{cid} as {shape}: {_show(base)} became {_show(got)}"
    if v.lost:
        assert verdict(case.expected, got) != "WRONG", f"{said} (the shape drops {v.lost})"
        return
    assert _key(got, {}) == _key(base, v.rename), said
    if base.root_cause:
        ranks = {base.root_cause.rank} | (set(v.injected_ranks) if base.root_cause.rank is None
                                          else set())
        assert got.root_cause.rank in ranks, said


@pytest.mark.parametrize("cid", [c for c in CASES if shapes.kernel_files(_case(c))])
def test_every_kernel_shape_keeps_each_lines_message_and_instant(cid):
    """The generator's own check: a kernel line printed in any text shape reads back with its
    message and its record's further lines, and, where the source had a wall clock and the
    shape prints one, at the second it had."""
    case = _case(cid)
    ref = shapes.reference_us(case)
    for shape in set(shapes.KERNEL_SHAPES) - {"journal-json"}:
        v = shapes.make(case, shape)
        for rel in shapes.kernel_files(case) if v else ():
            before = shapes.read_kernel(shapes.text(case.files[rel]), ref)
            after = shapes.read_kernel(shapes.text(v.files[rel]), ref)
            if after.recs == before.recs:
                continue                             # left as it was (cannot be printed so)
            said = f"{cid} {rel} as {shape}"
            assert _said(after) == _said(before), said
            if before.clock == "wall" and after.clock == "wall":
                assert _seconds(after) == _seconds(before), said


def _said(log):
    """Every line the kernel printed (syslog writes a record's further lines as records)."""
    return [ln.strip() for r in log.recs if r.kernel for ln in [r.msg] + r.cont]


def _seconds(log):
    """Each printed line's second, without the year (syslog's stamps have none)."""
    return [datetime.fromtimestamp(r.wall_us // shapes.US, timezone.utc).strftime("%m-%d %T")
            for r in log.recs if r.kernel for _ in [r.msg] + r.cont]
