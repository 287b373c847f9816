"""Rank output scanned on its node and shipped as `.lines` (collectors/output_lines.py): a folder
whose rank output files are replaced by their extracts gives the same diagnosis JSON, byte for
byte, as the folder with the files, on every case and on a generated job; the extract is job
output and hostile input like the file it stands for."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sattrib.analysis import analyze_folder, reader_limits
from sattrib.collectors import output_lines, slurm_job
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


# -- the node's Epilog ships, the controller writes the extracts -------------------------------

def _job_env(work, node, pattern, **extra):
    from sattrib.collectors import slurm_env
    return slurm_env.from_env(dict({
        "SLURM_JOB_ID": "8801", "SLURM_JOB_EXIT_CODE": "256", "SLURM_JOB_EXIT_CODE2": "1:0",
        "SLURM_NODELIST": "k[1-2]", "SLURMD_NODENAME": node, "SLURM_CLUSTER_NAME": "kc",
        "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "root",
        "SLURM_JOB_WORK_DIR": str(work), "SLURM_JOB_STDOUT": pattern}, **extra))


def test_which_files_are_the_nodes_own(tmp_path):
    from sattrib.collectors.slurm_job import node_output_paths
    w = tmp_path
    for name in ("k1.out", "k2.out", "idx-0.out", "idx-1.out", "k1-t0.log", "k1-t3.log",
                 "k2-t1.log", "r0.log", "[x]k1.out"):
        (w / name).write_text("x\n")
    paths = lambda node, pattern, globs=(): [  # noqa: E731
        os.path.basename(p) for p in node_output_paths(_job_env(w, node, pattern), node,
                                                       list(globs))]
    assert paths("k1", "%N.out") == ["k1.out"]
    assert paths("k2", str(w / "%N.out")) == ["k2.out"]
    assert paths("k2", "idx-%n.out") == ["idx-1.out"]
    assert paths("k1", "%N-t%t.log") == ["k1-t0.log", "k1-t3.log"]
    assert paths("k1", "r%t.log") == []                    # per task only: the controller's
    assert paths("k1", "slurm-%j.out") == []               # one file for the job: the controller's
    assert paths("k1", "[x]%N.out") == ["[x]k1.out"]       # the user's text is not glob syntax
    assert paths("k2", "/dev/null", ["*-t*.log"]) == []    # a glob with no node part
    assert paths("k2", "/dev/null", ["%N-t*.log"]) == ["k2-t1.log"]
    assert paths("k9", "idx-%n.out") == []                 # not in the job's node list


def _node_files(work):
    for node, rank in (("k1", 0), ("k2", 1)):
        lines = [f"{rank}: step {i} loss 1.{i}" for i in range(3000)]
        lines += [f"{rank}: Traceback (most recent call last):",
                  f'{rank}:   File "/w/train.py", line 40, in <module>',
                  f'{rank}:   File "/w/packed.py", line 118, in pack',
                  f"{rank}: RuntimeError: CUDA error: an illegal memory access was encountered"]
        (work / f"out-{node}.out").write_text("\n".join(lines) + "\n")


def test_node_extracts_replace_the_controllers_copies(tmp_path, monkeypatch):
    """k1's Epilog ships its file as an extract; k2 sent a snapshot without one (its Epilog
    ran out of time): the bundle holds k1's extract and k2's copy, and the stored diagnosis
    is the one the full files give."""
    import time

    from sattrib.collect import collect_job
    from sattrib.collectors import spool
    from sattrib.slurm_hooks import epilog
    from tests.test_collect import JOB_TXT, _fake_slurm

    now = time.time()
    work = tmp_path / "work"
    work.mkdir()
    _node_files(work)
    _fake_slurm(monkeypatch, now, work)
    job = JOB_TXT.format(user="root", uid=os.getuid(), start="2026-01-01T00:00:00",
                         end="2026-01-01T00:10:00", work=work).replace(
        "slurm-%j.out", "out-%N.out").replace("NodeList=k[1-2]", "NodeList=k[1-2] BatchHost=k1")
    monkeypatch.setattr(slurm_job, "scontrol_job", lambda j, d: (job, ""))
    monkeypatch.setattr(slurm_job, "wait_final", lambda j, d, poll=1.0: (job, ""))
    st = Settings(cluster="kc", database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                  spool_dir=str(tmp_path / "spool"), spool_auth="owner", collect_wait_s=1.0)
    for node in ("k1", "k2"):
        env = _job_env(work, node, str(work / "out-%N.out"))
        notes: list = []
        monkeypatch.setattr("socket.gethostname", lambda n=node: n)
        outputs = (epilog._ship_outputs(env, st, time.monotonic() + 30, notes)
                   if node == "k1" else [])
        spool.write_snapshot(Path(st.spool_dir), "kc", "8801", 0, node, {
            "format": spool.FORMAT, "job_id": "8801", "restart": 0, "node": node,
            "files": {}, "probes": [], "outputs": outputs, "notes": notes},
            time.monotonic() + 10, munge=False)
    env = _job_env(work, "k1", str(work / "out-%N.out"))
    out = collect_job("8801", st, env_job=env)
    record = json.loads((out.bundle / "slurm" / "sattrib-run.json").read_text())
    assert record["outputs"] == [
        {"extract": "logs/output-000.txt.lines", "source": str(work / "out-k1.out"),
         "node": "k1"},
        {"copy": "logs/output-001.txt", "source": str(work / "out-k2.out")}]
    assert sorted(p.name for p in (out.bundle / "logs").iterdir()) == [
        "output-000.txt.lines", "output-001.txt"]
    # The same bundle with the full file in place of the extract.
    full = tmp_path / "full"
    shutil.copytree(out.bundle, full)
    (full / "logs" / "output-000.txt.lines").unlink()
    shutil.copy(work / "out-k1.out", full / "logs" / "output-000.txt")
    want = analyze_folder(full)[0]
    assert want.root_cause.user_frames and want.root_cause.category.value == "application_error"
    assert out.diagnosis.model_dump_json() == want.model_dump_json()


def test_an_extract_made_with_other_rules_is_not_used(tmp_path, monkeypatch, rules):
    from sattrib.collect import _shipped_outputs

    class Snap:
        def __init__(self, outputs):
            self.data = {"outputs": outputs}
    work = tmp_path
    _node_files(work)
    got = output_lines.extract(str(work / "out-k1.out"), None, CAP, FolderReader(rules),
                               rules.version)
    st = Settings(rules_dirs=[])
    notes: list = []
    assert list(_shipped_outputs({"k1": Snap([got])}, st, notes)) == [str(work / "out-k1.out")]
    old = dict(got, lines=got["lines"].replace(rules.version, "sha256:old", 1))
    assert _shipped_outputs({"k1": Snap([old, {"source": "relative", "lines": "x"}])},
                            st, notes) == {}
    assert notes == [f"k1: extract of {work / 'out-k1.out'} made with other rules or limits "
                     "(sha256:old): copied instead"]


def test_controller_finds_every_nodes_and_tasks_file(tmp_path):
    """What no node ships, the controller copies: a %N / %n / %t pattern names the batch
    host's file first (as Slurm expands it for the batch script), then each other node's or
    task's that exists."""
    for name in ("k1.out", "k2.out", "n-0.out", "n-1.out", "t-0.log", "t-1.log", "t-2.log"):
        (tmp_path / name).write_text("x\n")
    info = {"JobId": "8801", "WorkDir": str(tmp_path), "BatchHost": "k1", "NumTasks": "3"}
    names = lambda out, globs=(): [os.path.basename(p) for p in slurm_job.output_paths(  # noqa
        dict(info, StdOut=out), list(globs), [], ["k1", "k2", "k3"])]
    assert names("%N.out") == ["k1.out", "k2.out"]
    assert names("n-%n.out") == ["n-0.out", "n-1.out"]
    assert names("t-%t.log") == ["t-0.log", "t-1.log", "t-2.log"]
    assert names("slurm-%j.out") == ["slurm-8801.out"]
    assert names("/dev/null", ["n-%n.out"]) == ["n-0.out", "n-1.out"]    # any index


def test_header_values_are_bounded(rules, tmp_path):
    path = _lines_file(tmp_path / "job", rules)
    head, rest = path.read_text().split("\n", 1)
    header = json.loads(head)
    header.update(notes=["n" * 5000] * 500 + [7], size="big", cut=-3, tags="yes",
                  stamps=["s" * 99999] * 80)
    rep = output_lines.parse((json.dumps(header) + "\n" + rest).encode())
    assert len(rep.notes) == output_lines.MAX_LIST and {len(n) for n in rep.notes} == {1000}
    assert (rep.header["size"], rep.header["cut"], rep.header["tags"]) == (0, 0, "")
    assert len(rep.header["stamps"]) == 50 and {len(s) for s in rep.header["stamps"]} == {16384}
    # A node of the release before says only whether srun's task numbers tag the lines.
    del header["tags"]
    header["srun"] = True
    rep = output_lines.parse((json.dumps(header) + "\n" + rest).encode())
    assert rep.header["tags"] == "srun"
