"""Public text is built from fields, never from a user's line: a secret a program prints (an
exception's value, a file name, a message) reaches the evidence line, which only those allowed
to read evidence see, and nothing else of the diagnosis: not the summary, the candidates, the
explanation, the action, the webhook body, the mail or the drain reason."""
import json

import pytest

from sattrib.actions import drain_reason, payload
from sattrib.analysis import analyze_folder
from sattrib.config import Settings
from sattrib.engine.matcher import closed
from sattrib.engine.rules import RuleError, load_rules

SECRET = "sk-live-SECRET123"

# (file, line, the rule that must name the cause, what its summary says instead)
HOSTILE = {
    "exception value": (
        "logs/job.out", f"[rank3]: KeyError: 'api_token={SECRET}'",
        "python.exception", "rank 3 raised KeyError"),
    "errno path": (
        "logs/job.out", f"[rank3]: OSError: [Errno 28] No space left on device: '/home/u/{SECRET}'",
        "python.errno", "rank 3: No space left on device (errno 28)"),
    "CUDA message tail": (
        "logs/job.out", f"[rank3]: RuntimeError: CUDA error: invalid argument {SECRET}",
        "cuda.error_string", "rank 3: CUDA error: invalid argument"),
    "file in a wrapped strerror": (
        "logs/job.out", "[rank3]: RuntimeError: [enforce fail at inline_container.cc:470] . "
        f"PytorchStreamWriter failed writing file {SECRET}: file write failed",
        "python.strerror", "rank 3: PytorchStreamWriter failed writing file"),
    "host name that is no name": (
        "logs/job.out", "submitit WARNING (2022-07-12 04:18:45,881) - Caught signal SIGHUP on "
        f"api_token={SECRET}: this job is preempted.",
        "launcher.submitit_preempted", "submitit: SIGHUP: the job was preempted"),
    "process name the kernel quotes": (
        "node-01/journal.log", "2026-11-02T10:00:00+0000 node-01 kernel: Out of memory: Killed "
        f"process 1234 ({SECRET}) total-vm:1kB, anon-rss:1kB",
        "host.oom_kill", "Out of memory on node-01: killed process 1234"),
    "node reason": (
        "slurm/nodes.txt", f"NodeName=node-01 Arch=x86_64 State=DOWN+NOT_RESPONDING "
        f"Reason={SECRET} [root@2026-11-02T10:00:00]",
        "slurm.node_down", "Slurm reports node-01 DOWN+NOT_RESPONDING"),
}


def analyze(tmp_path, files: dict, rules):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text + "\n")
    return analyze_folder(tmp_path, rules=rules)[0]


def public_view(d) -> dict:
    """The diagnosis as the dashboard shows it to anyone: no evidence text or metric, no frames
    of the user's code."""
    doc = json.loads(d.model_dump_json())
    for e in doc["evidence"]:
        del e["text"], e["metric"]
    for c in ([doc["root_cause"]] if doc["root_cause"] else []) + doc["candidates"]:
        del c["user_frames"]
    return doc


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_secret_in_a_line_stays_in_its_evidence_text(tmp_path, rules, name):
    path, line, rule, said = HOSTILE[name]
    d = analyze(tmp_path, {path: line}, rules)
    assert d.outcome.value == "attributed" and d.root_cause.rule == rule
    assert d.root_cause.summary == said
    assert any(SECRET in e.text for e in d.evidence)       # the line itself was read
    assert SECRET not in json.dumps(public_view(d))
    body = payload("c/1/0", d.model_dump(mode="json"), [], None, Settings())
    assert SECRET not in json.dumps(body)                 # webhook and mail text
    assert SECRET not in drain_reason(d.model_dump(mode="json"), "node-01")


def test_candidates_and_explanation_carry_no_secret(tmp_path, rules):
    """The kernel kills a process on each of two nodes in the same second: both are candidates,
    each named by the kernel's quote of the user's process name."""
    kill = ("2026-11-02T10:00:00+0000 {n} kernel: Out of memory: Killed process {p} ({c}) "
            "total-vm:1kB, anon-rss:1kB")
    d = analyze(tmp_path, {
        "node-01/journal.log": kill.format(n="node-01", p=1234, c=SECRET),
        "node-02/journal.log": kill.format(n="node-02", p=99, c=f"py{SECRET}")}, rules)
    assert d.outcome.value == "ambiguous" and len(d.candidates) == 2
    assert [c.summary for c in d.candidates] == ["Out of memory on node-01: killed process 1234",
                                                 "Out of memory on node-02: killed process 99"]
    assert "killed process 1234" in d.explanation
    assert SECRET not in json.dumps(public_view(d))


def test_closed_patterns_are_their_own_words():
    assert closed("^No space left on device(?:$|: )")
    assert closed("(?P<r>TIME LIMIT|PREEMPTION) at \\d+")
    assert closed("[Nn]o algorithm")
    for open_ in (".+", "\\S+ bytes", "[A-Z_]+", "[^']*", "\\w+", "0x[0-9a-f]+"):
        assert not closed(open_), open_
    assert closed("x (?P<n>\\d+) (?P<m>.+)", "n") and not closed("x (?P<n>\\d+) (?P<m>.+)", "m")


def test_words_must_be_a_closed_capture(tmp_path):
    rule = tmp_path / "site" / "thing.yaml"
    rule.parent.mkdir()
    rule.write_text("""id: site.thing
title: A thing
category: storage_io
role: root
source: kernel
pattern: 'thing (?P<what>\\S+) failed'
explain: 'thing {what}'
public: {what: words}
examples:
  match:
    - line: 'thing x failed'
""")
    with pytest.raises(RuleError, match="capture 'what' is not 'words'"):
        load_rules([tmp_path])
    rule.write_text(rule.read_text().replace("public: {what: words}", "public: {what: name}"))
    assert "site.thing" in load_rules([tmp_path]).by_id
