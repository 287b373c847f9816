"""The fast path (literal prefilter, forked readers, matches reused from the reader) gives the
same diagnosis, byte for byte, as the plain reference path: no prefilter, one process, no rule
cache, every rule's regex on every line. Speed never changes an answer."""
from pathlib import Path

import pytest

from sattrib import __version__
from sattrib.analysis import add_user_frames, analyze_folder
from sattrib.collectors.evidence_folder import FolderReader
from sattrib.engine.catalog import Row
from sattrib.engine.pipeline import Settings, diagnose
from sattrib.engine.rules import CompiledRule, load_rules

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared"
ROOTS = [HERE / "cases", HERE / "cases-real", SHARED / "cases", SHARED / "cases-real"]
CASES = [c for r in ROOTS if r.is_dir() for c in sorted(r.iterdir())
         if c.is_dir() and not c.name.startswith((".", "_"))]


@pytest.fixture(scope="module")
def reference_rules():
    return load_rules(cache=False)


def _json(case: Path, **kw) -> str:
    return analyze_folder(case, **kw)[0].model_dump_json(indent=2)


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_fast_path_equals_reference(case, rules, reference_rules, monkeypatch):
    want = _json(case, rules=reference_rules, reference=True)
    assert _json(case, rules=rules) == want
    # The forked readers too, however many files each one reads.
    monkeypatch.setattr(FolderReader, "PARALLEL_MIN_BYTES", 0)
    assert _json(case, rules=rules) == want


def test_reference_uses_no_prefilter_and_no_worker(reference_rules, monkeypatch):
    """The reference path never touches the literal prefilter and never forks, even on a job
    big enough for the forked readers."""
    assert len(CASES) >= 30, "the case folders were not found"
    case = HERE / "cases" / "xid79_srun_combined_log"
    want = _json(case, rules=reference_rules, reference=True)

    def no_prefilter(self):
        raise AssertionError("the reference path used the prefilter")
    monkeypatch.setattr(type(reference_rules), "prefilter", property(no_prefilter))
    monkeypatch.setattr(FolderReader, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", None)
    assert _json(case, rules=reference_rules, reference=True) == want
    assert '"outcome": "attributed"' in want


def test_extract_reuses_the_readers_matches(rules, monkeypatch):
    """The reader's confirm step already ran each candidate rule on each line: extract builds
    the events from those matches and catalog rows (they come back from the forked readers with
    the lines) and runs no rule or catalog pattern again."""
    monkeypatch.setattr(FolderReader, "PARALLEL_MIN_BYTES", 0)
    cases = [c for c in CASES if c.parent.parent == HERE]
    read = []
    for case in cases:
        reader = FolderReader(rules)
        bundle = reader.read(case)
        assert all(ln.found is not None for ln in bundle.lines)
        read.append((_json(case, rules=rules), bundle, reader.offset, case))
    assert any(e[1] is not None for _, b, _, _ in read for ln in b.lines
               for e in ln.found.values()), "no case exercises a catalog row"

    def no_search(self, message):
        raise AssertionError("extract searched a line again")
    monkeypatch.setattr(CompiledRule, "search", no_search)
    monkeypatch.setattr(Row, "search", no_search)
    for want, bundle, offset, case in read:
        d = diagnose(bundle, rules, Settings(utc_offset=offset), engine_version=__version__)
        add_user_frames(d, case)          # read back from the files, as analyze_folder does
        assert d.model_dump_json(indent=2) == want
