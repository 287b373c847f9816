"""Rank output scanned on its node and shipped as `.lines` (collectors/output_lines.py): a folder
whose rank output files are replaced by their extracts gives the same diagnosis JSON, byte for
byte, as the folder with the files, on every case and on a generated job; the extract is job
output and hostile input like the file it stands for."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sattrib.analysis import analyze_folder, reader_limits
from sattrib.collectors import output_lines
from sattrib.collectors.evidence_folder import FolderReader
from sattrib.config import Settings
from tests.test_reference import CASES

HERE = Path(__file__).resolve().parent
CAP = Settings().output_cap_mb << 20


def _json(folder: Path, rules) -> str:
    return analyze_folder(folder, rules=rules)[0].model_dump_json(indent=2)


def ship_lines(folder: Path, rules, cap: int = CAP, limits=None) -> list[str]:
    """Replace every rank output file of `folder` by the extract a node would ship for it,
    as the controller names it (`X.lines` for `X`). Returns the paths replaced."""
    limits = limits or reader_limits(Settings())
    bundle = FolderReader(rules, limits=limits).read(folder)
    done = []
    for doc in bundle.documents:
        if doc.kind != "rank_output":
            continue
        src = folder / doc.path
        got = output_lines.extract(str(src), None, cap, FolderReader(rules, limits=limits),
                                   rules.version)
        assert got["lines"] is not None, got
        (folder / (doc.path + ".lines")).write_text(got["lines"])
        src.unlink()
        done.append(doc.path)
    return done


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_lines_replay_gives_the_same_diagnosis(case, rules, tmp_path):
    folder = tmp_path / "job"
    shutil.copytree(case, folder, symlinks=True)
    want = _json(folder, rules)
    if not ship_lines(folder, rules):
        pytest.skip("no rank output in this case")
    assert _json(folder, rules) == want


def test_user_frames_come_from_the_nodes_extract(rules, tmp_path):
    """root_cause.user_frames is read back from the file above the error line: with only the
    extract in the folder, the frames the node found there give the same answer."""
    folder = tmp_path / "job"
    shutil.copytree(HERE / "cases-real" / "r2a-megatron-64v100-mp2-flatten-grads-cuda-oom",
                    folder)
    want = _json(folder, rules)
    assert '"user_frames": [' in want and "allreduce_params" in want
    assert ship_lines(folder, rules)
    assert _json(folder, rules) == want


def test_cut_file_replays_like_the_controllers_cut_copy(rules, tmp_path):
    """A file above output_cap_mb: the controller copies its first and last halves back to
    back; the node scans exactly that view (offsets, line numbers, the line cut at the seam)."""
    case = HERE / "cases" / "xid79_srun_combined_log"
    big = tmp_path / "big"
    shutil.copytree(case, big)
    log = next(p for p in sorted((big / "logs").iterdir()) if p.is_file())
    data = log.read_bytes()
    log.write_bytes(b"noise line that matches nothing\n" * 4000 + data + b"x" * 5000 + data)
    cap = 64 << 10
    full = tmp_path / "full"
    shutil.copytree(big, full)
    size = log.stat().st_size
    with open(log, "rb") as f:
        head, tail = f.read(cap // 2), (f.seek(size - cap // 2), f.read())[1]
    (full / "logs" / log.name).write_bytes(head + tail)      # what copy_output keeps
    got = output_lines.extract(str(log), None, cap, FolderReader(rules), rules.version)
    header = json.loads(got["lines"].split("\n", 1)[0])
    assert header["size"] == cap and header["copy_note"].endswith(
        f"{size} bytes, kept the first and last {cap // 2} bytes")
    lines = tmp_path / "lines"
    shutil.copytree(full, lines)
    (lines / "logs" / log.name).unlink()
    (lines / "logs" / (log.name + ".lines")).write_text(got["lines"])
    assert _json(lines, rules) == _json(full, rules)


def test_generated_job_replays_identically(rules, tmp_path):
    out = tmp_path / "gen"
    subprocess.run([sys.executable, str(HERE.parent / "bench" / "make_job.py"), "--nodes", "4",
                    "--ranks-per-node", "4", "--mb-per-rank", "0.3", "--out", str(out)],
                   check=True, capture_output=True)
    want = _json(out, rules)
    assert '"outcome": "attributed"' in want
    assert len(ship_lines(out, rules)) >= 16
    assert _json(out, rules) == want


def _lines_file(folder: Path, rules) -> Path:
    shutil.copytree(HERE / "cases" / "xid79_srun_combined_log", folder)
    ship_lines(folder, rules)
    return next((folder / "logs").glob("*.lines"))


def test_extract_is_job_output_whatever_it_says(rules, tmp_path):
    """A record imitating a kernel Xid line is job output: never kernel evidence."""
    folder = tmp_path / "job"
    shutil.copytree(HERE / "cases" / "app_exception_fake_kernel_lines", folder)
    want = _json(folder, rules)
    ship_lines(folder, rules)
    d = json.loads(_json(folder, rules))
    assert json.dumps(d, indent=2) == json.dumps(json.loads(want), indent=2)
    assert all(e["trust"] == "job_output" for e in d["evidence"]
               if e["path"].endswith((".txt", ".out", ".err", ".stderr", ".stdout", ".log"))
               and not e["path"].endswith("journal.log"))


def test_broken_records_are_skipped_with_a_note(rules, tmp_path):
    path = _lines_file(tmp_path / "job", rules)
    head, *records = path.read_text().splitlines()
    good = len(records)
    bad = ["not json", "[1, 2]", '{"o": -1, "t": "x", "l": ["a"]}',
           '{"o": 1, "t": 5, "l": ["a"]}', '{"o": 1, "t": "x", "l": []}',
           '{"o": 1, "t": "x", "l": ["a"], "p": "not a list"}',
           '{"o": 1, "n": true, "t": "x", "l": ["a"]}', "\x00\xff garbage"]
    path.write_text("\n".join([head] + records + bad) + "\n")
    rep = output_lines.parse(path.read_bytes())
    assert len(rep.hits) == good
    assert rep.notes[-1] == f"{len(bad)} unreadable records in the node's extract skipped"
    d = json.loads(_json(tmp_path / "job", rules))
    assert any("unreadable records in the node's extract skipped" in n
               for n in d["completeness"]["notes"])


def test_not_an_extract_is_read_as_a_plain_file(rules, tmp_path):
    """A `.lines` name with other content (or a bad header) is an ordinary file; a huge extract
    is read up to its bound only."""
    assert output_lines.parse(b'{"format": "other/1"}\n{"o": 1}\n') is None
    assert output_lines.parse(b"\xff\xfe\n") is None
    path = _lines_file(tmp_path / "job", rules)
    text = path.read_text()
    path.write_text(text.replace('"format": "sattrib-lines/1"', '"format": "sattrib-lines/9"'))
    docs = FolderReader(rules).read(tmp_path / "job").documents
    assert [(d.path, d.kind) for d in docs if d.path == f"logs/{path.name}"] == [
        (f"logs/{path.name}", "rank_output")]


def test_extract_is_bounded(rules, tmp_path, monkeypatch):
    path = _lines_file(tmp_path / "job", rules)
    head, *records = path.read_text().splitlines()
    monkeypatch.setattr(output_lines, "MAX_BYTES", len(head) + 1 + len(records[0]) + 10)
    with open(path, "rb") as f:
        rep = output_lines.read(f.fileno())
    assert len(rep.hits) == 1
    assert "records past that not read" in rep.notes[-1]


def test_other_rules_are_named_in_the_notes(rules, tmp_path):
    path = _lines_file(tmp_path / "job", rules)
    path.write_text(path.read_text().replace(rules.version, "sha256:older", 1))
    d = json.loads(_json(tmp_path / "job", rules))
    assert any("extracted on the node with rules sha256:older" in n
               for n in d["completeness"]["notes"])
