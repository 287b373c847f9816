"""Golden evidence folders in tests/cases/<root>_<context>/ with the expected verdict (outcome,
cause, action_code, missing sources, symptom groups as "rule category nodes"), and
determinism: the same evidence in any order gives byte-identical JSON."""
import json
import random
import shutil

import pytest

from helpers import CASES, folder
from sattrib.analysis import analyze_folder
from sattrib.collectors.evidence_folder import FolderReader
from sattrib.engine.pipeline import diagnose

NAMES = sorted(p.name for p in CASES.iterdir() if (p / "expected.json").is_file())


@pytest.mark.parametrize("name", NAMES)
def test_case(name, rules):
    want = json.loads((CASES / name / "expected.json").read_text())
    d, _ = analyze_folder(CASES / name, rules=rules)
    assert d.outcome.value == want["outcome"]
    root = d.root_cause
    if want["outcome"] == "attributed":
        assert root.category.value == want["category"]
        assert root.node == want["node"]
        for key in ("gpu", "rank"):
            if key in want:
                assert getattr(root, key) == want[key]
        # The root points at evidence, and each evidence item at its origin.
        ids = {e.id: e for e in d.evidence}
        assert root.evidence and all(i in ids for i in root.evidence)
        first = ids[root.evidence[0]]
        assert first.path and (first.line is not None or first.offset is not None or first.cursor)
    else:
        assert root is None
    if want["outcome"] == "ambiguous":
        assert sorted(c.node for c in d.candidates) == want["candidates"]
    # What to do, what was missing and what else went wrong are pinned too: a change to any
    # of them is a change to the diagnosis a person acts on.
    assert d.action_code.value == want["action_code"]
    assert d.completeness.missing == want["missing"]
    assert [_group(s) for s in d.symptoms] == want["symptoms"]


def _group(s) -> str:
    """A symptom group as the cases pin it: "rule category nodes"."""
    nodes = s.nodes or ([s.node] if s.node else [])
    return f"{s.rule} {s.category} {','.join(nodes)}".rstrip()


@pytest.mark.parametrize("name", NAMES)
def test_shuffled_input_gives_identical_json(name, rules):
    reader = FolderReader(rules)
    bundle = reader.read(CASES / name)
    a = diagnose(bundle, rules, engine_version="t").model_dump_json()
    for seed in (1, 2, 3):
        b2 = reader.read(CASES / name)
        rnd = random.Random(seed)
        rnd.shuffle(b2.lines)
        rnd.shuffle(b2.documents)
        assert diagnose(b2, rules, engine_version="t").model_dump_json() == a


def test_copy_elsewhere_gives_identical_json(tmp_path, rules):
    """Nothing about where or when the folder is read leaks into the diagnosis."""
    name = "xid79_srun_combined_log"
    a, _ = analyze_folder(CASES / name, rules=rules)
    shutil.copytree(CASES / name, tmp_path / "x")
    b, _ = analyze_folder(tmp_path / "x", rules=rules)
    assert a.model_dump_json() == b.model_dump_json()


def test_a_kept_bundle_replays_to_the_same_diagnosis(tmp_path, rules):
    """What sattrib wrote into a kept bundle (the diagnosis, the actions taken on it) is never
    read back as evidence: replaying the bundle gives the diagnosis it holds, byte for byte
    (actions.json was once read as the job's output)."""
    from sattrib.actions import _write_bundle
    from sattrib.demo import write_demo
    bundle = write_demo(tmp_path / "1001.0")
    first, _ = analyze_folder(bundle, rules=rules)
    (bundle / "diagnosis.json").write_text(first.model_dump_json(indent=2) + "\n")
    _write_bundle(bundle, {"actions": [
        {"kind": "drain", "decision": "failed", "node": "node-02", "command": None,
         "detail": "cannot read the state of node-02: scontrol: fatal: Could not establish a "
                   "configuration source", "created_at": "2026-11-02T10:25:00Z"},
        {"kind": "notify", "decision": "failed", "node": None, "command": None,
         "detail": "not sent after 3 attempts: RuntimeError: CUDA error: an illegal memory "
                   "access was encountered", "created_at": "2026-11-02T10:25:01Z"}],
        "escalation": None})
    again, _ = analyze_folder(bundle, rules=rules)
    assert again.model_dump_json() == first.model_dump_json()


def test_fake_kernel_lines_are_not_kernel_evidence(rules):
    d, _ = analyze_folder(CASES / "app_exception_fake_kernel_lines", rules=rules)
    assert all(e.source.value != "kernel" or "Xid" not in e.text for e in d.evidence)
    assert any("kernel-looking lines" in n for n in d.completeness.notes)


def test_user_logger_line_in_journal_is_not_kernel(rules):
    d, _ = analyze_folder(CASES / "journal_json_transport_trust", rules=rules)
    assert d.root_cause.gpu == "0000:61:00.0"        # the kernel's Xid 48, not the user's 79
    root = {e.id: e for e in d.evidence}[d.root_cause.evidence[0]]
    assert root.cursor == "s=2;i=9" and root.source.value == "kernel"


def test_stale_event_outside_window_is_ignored(rules):
    d, _ = analyze_folder(CASES / "new_year_stale_xid", rules=rules)
    assert d.root_cause.first_seen == "2026-01-01T00:14:07Z"
    assert any("before the job's time window" in n for n in d.completeness.notes)


def test_evidence_says_why_it_counts_otherwise_than_its_rule(tmp_path, rules):
    """The pipeline's reason for reading a line otherwise than its rule alone says (here a
    recast by the frame above it) is the evidence's `because`; a line read as its rule says
    has none."""
    trace = ('Traceback (most recent call last):\n'
             '  File "/usr/lib/python3.10/multiprocessing/synchronize.py", line 57, in __init__\n'
             '    sl = self._semlock = _multiprocessing.SemLock(\n'
             'OSError: [Errno 28] No space left on device\n')
    d, _ = analyze_folder(folder(tmp_path / "job", {"logs/slurm-7.out": trace}), rules=rules)
    assert d.root_cause.category.value == "host_oom"
    assert {e.because for e in d.evidence if e.id in d.root_cause.evidence} == {
        "raised while allocating shared memory (/dev/shm): host shared memory ran out"}
    d, _ = analyze_folder(CASES / "xid79_srun_combined_log", rules=rules)
    assert {e.because for e in d.evidence} == {None}
