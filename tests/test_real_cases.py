"""Real failures posted in public threads (tests/cases-real/<case>/, the layout and conventions
of the shared real corpus: lines as posted, source.md with URL, who established the cause and a
grade). Scored the way the contract's scorer scores: the outcome, and for an attributed case
the category family and the culprit node.

A confidently wrong answer fails its case. An honest miss (ambiguous or unattributed where the
thread established a cause) is allowed per case, but the corpus as a whole must stay at or above
MIN_CORRECT, so coverage only ratchets up."""
import json
import shutil
from pathlib import Path

import pytest

from sattrib.analysis import analyze_folder
from sattrib.engine.taxonomy import FAMILY, Category

REAL = Path(__file__).parent / "cases-real"
NAMES = sorted(p.name for p in REAL.iterdir() if (p / "expected.json").is_file()) \
    if REAL.is_dir() else []
MIN_CORRECT = 0.90
ANSWER_FILES = {"expected.json", "source.md", "README.md"}


def _analyze(case: Path, rules, tmp: Path):
    """The case as the scorer hands it over: its evidence only, without the answer files."""
    staged = tmp / case.name
    shutil.copytree(case, staged, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n in ANSWER_FILES
                                             and Path(d) == case])
    return analyze_folder(staged, rules=rules)[0]


def _short(node):
    return str(node).split(".")[0].lower() if node else None


def verdict(want: dict, d) -> str:
    """The scorer's verdict, with its `accept` list: other answers the evidence honestly
    supports count as correct."""
    v = _verdict(want, d)
    if v != "CORRECT":
        r = d.root_cause
        for alt in want.get("accept") or []:
            if d.outcome.value != alt.get("outcome"):
                continue
            if alt.get("family") and (r is None or FAMILY[r.category] != alt["family"]):
                continue
            if alt.get("node") and (r is None or _short(r.node) != _short(alt["node"])):
                continue
            return "CORRECT"
    return v


def _verdict(want: dict, d) -> str:
    nodes = {_short(n) for n in want.get("culprit_nodes") or []}
    have = d.outcome.value
    if want["outcome"] == "unattributed":
        return "CORRECT" if have == "unattributed" else \
            "MISS" if have == "ambiguous" else "WRONG"
    if want["outcome"] == "ambiguous":
        if have == "ambiguous":
            cands = {_short(c.node) for c in d.candidates}
            return "CORRECT" if nodes <= cands else "MISS"
        return "MISS" if have == "unattributed" else "WRONG"
    if have != "attributed":
        return "MISS"
    fam = FAMILY[d.root_cause.category] == FAMILY[Category(want["category"])]
    node = not nodes or _short(d.root_cause.node) in nodes
    return "CORRECT" if fam and node else "WRONG"


_RESULTS: dict[str, str] = {}


@pytest.mark.parametrize("name", NAMES)
def test_real_case_is_never_confidently_wrong(name, rules, tmp_path):
    case = REAL / name
    want = json.loads((case / "expected.json").read_text())
    assert (case / "source.md").is_file(), "every real case names its source"
    d = _analyze(case, rules, tmp_path)
    _RESULTS[name] = v = verdict(want, d)
    got = d.root_cause
    assert v != "WRONG", (f"{name}: named {got.category.value if got else d.outcome.value}"
                          f"@{got.node if got else '-'}, want {want['outcome']} "
                          f"{want.get('category')} {want.get('culprit_nodes')}")


def test_real_corpus_is_mostly_right(rules, tmp_path):
    if not NAMES:
        pytest.skip("no real cases in tests/cases-real")
    for name in NAMES:
        if name not in _RESULTS:
            want = json.loads((REAL / name / "expected.json").read_text())
            _RESULTS[name] = verdict(want, _analyze(REAL / name, rules, tmp_path))
    correct = sum(v == "CORRECT" for v in _RESULTS.values())
    misses = sorted(n for n, v in _RESULTS.items() if v != "CORRECT")
    assert correct >= MIN_CORRECT * len(NAMES), f"{correct}/{len(NAMES)} correct; not: {misses}"
