"""The command line: default command, errors as one line with a hint, help with examples."""
import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from helpers import CASES
from sattrib.cli import main


def run(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "sattrib", *args], capture_output=True,
                          text=True, env=e, timeout=120)


def test_demo_then_default_show(tmp_path):
    r = run("demo")
    assert r.returncode == 0, r.stderr
    assert "Outcome: ATTRIBUTED" in r.stdout and "nvlink on node-02" in r.stdout
    assert "\x1b[" not in r.stdout                       # no colour when not a terminal
    for nccl in ("socket", "IB/RoCE completion error", "watchdog timeout"):
        assert nccl in r.stdout
    r2 = run("1001", "--json")
    assert r2.returncode == 0
    d = json.loads(r2.stdout)
    assert d["root_cause"]["category"] == "nvlink" and d["root_cause"]["node"] == "node-02"
    assert d["root_cause"]["gpu"] == "0000:9d:00.0"


def test_unknown_job_is_one_line_with_hint():
    assert run("demo").returncode == 0
    r = run("424242")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("sattrib: error:") and lines[1].startswith("hint:")
    assert "Traceback" not in r.stderr and "sattrib collect 424242" in r.stderr


def test_missing_database_is_a_user_error(tmp_path):
    r = run("123", env={"SATTRIB_DATABASE": str(tmp_path / "none.db")})
    assert r.returncode == 1 and "no diagnoses database" in r.stderr and "Traceback" not in r.stderr
    assert "on a login node, set server_url" in r.stderr


def test_analyze_errors(tmp_path):
    r = run("analyze", str(tmp_path / "nope"))
    assert r.returncode == 1 and "no such folder" in r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    r = run("analyze", str(f))
    assert r.returncode == 1 and "not a folder" in r.stderr
    r = run("analyze")
    assert r.returncode == 2                                       # usage error


def test_analyze_refuses_what_is_not_one_jobs_folder(tmp_path):
    empty = tmp_path / "empty"
    (empty / "node-01").mkdir(parents=True)
    r = run("analyze", str(empty))
    assert r.returncode == 1 and "holds no evidence files" in r.stderr and "hint:" in r.stderr
    cases = tmp_path / "cases"
    for name in ("a-job", "b-job"):
        (cases / name / "slurm").mkdir(parents=True)
        (cases / name / "slurm" / "job.txt").write_text("JobId=1 JobState=FAILED\n")
        (cases / name / "expected.json").write_text("{}")
    r = run("analyze", str(cases))
    assert r.returncode == 1 and "a folder of evidence folders (a-job, b-job)" in r.stderr
    assert f"sattrib analyze {cases / 'a-job'}" in r.stderr
    r = run("analyze", str(cases / "a-job"), "--json")          # one of them is fine
    assert r.returncode == 0


def test_debug_shows_traceback(tmp_path):
    r = run("--debug", "analyze", str(tmp_path / "nope"))
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_analyze_json_matches_contract_and_store(tmp_path):
    db = tmp_path / "x.db"
    r = run("analyze", str(CASES / "xid48_ecc_nvidia_smi_xml"), "--json", "--store",
            "--cluster", "alps", "--database", str(db))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in ("job_id", "outcome", "root_cause", "candidates", "affected_nodes", "symptoms",
                "evidence", "completeness", "action", "rules_version", "engine_version"):
        assert key in d
    for e in d["evidence"]:
        assert {"id", "role", "source", "node", "path", "line", "timestamp", "text", "rule"} <= set(e)
    r = run("show", "7002", "--cluster", "alps", "--database", str(db))
    assert r.returncode == 0 and "gpu_memory_ecc on hx2" in r.stdout


def test_show_json_is_one_object_for_a_requeued_job_and_two_clusters(tmp_path):
    import sqlite3
    db = tmp_path / "x.db"
    case = str(CASES / "xid48_ecc_nvidia_smi_xml")
    assert run("analyze", case, "--store", "--cluster", "alps", "--database", str(db)
               ).returncode == 0
    con = sqlite3.connect(db)                         # a second run of the same job
    cols = [r[1] for r in con.execute("pragma table_info(diagnoses)")]
    row = dict(zip(cols, con.execute("select * from diagnoses").fetchone()))
    row.update(id="alps/7002/1", restart=1)
    con.execute(f"insert into diagnoses ({', '.join(row)}) values ({', '.join('?' * len(row))})",
                list(row.values()))
    con.commit()
    r = run("show", "7002", "--json", "--database", str(db))
    assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == "7002"     # one object
    r = run("show", "7002", "--all", "--json", "--database", str(db))
    assert [d["job_id"] for d in json.loads(r.stdout)] == ["7002", "7002"]
    r = run("show", "7002", "--database", str(db))
    assert r.stdout.startswith("Job 7002 (run 2 of 2) on alps")
    assert "ran 2 times; --all shows every run" in r.stderr
    r = run("show", "7002.batch", "--all", "--database", str(db))   # a step id, as sacct prints
    assert "Job 7002 (run 1 of 2) on alps" in r.stdout and "(run 2 of 2)" in r.stdout
    r = run("7002.batch", "--database", str(db))          # the same as the default command
    assert r.returncode == 0 and r.stdout.startswith("Job 7002 (run 2 of 2) on alps")
    r = run("show", "7002;rm", "--database", str(db))
    assert r.returncode == 1 and "not a job id" in r.stderr
    assert run("analyze", case, "--store", "--cluster", "daint", "--database", str(db)
               ).returncode == 0
    r = run("show", "7002", "--json", "--database", str(db))
    assert r.returncode == 1 and "known to clusters alps, daint" in r.stderr
    assert "--cluster alps" in r.stderr
    r = run("show", "7002", "--json", "--cluster", "daint", "--database", str(db))
    assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == "7002"


def test_no_color_turns_colours_off(monkeypatch):
    from sattrib.render import render
    d = {"job_id": "1", "outcome": "unattributed", "action": "collect", "rules_version": "r",
         "engine_version": "e"}
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert "\x1b[" in render(d)                       # click.echo strips it off a terminal
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in render(d)


def test_rules_commands(tmp_path):
    r = CliRunner().invoke(main, ["rules", "list"])
    assert r.exit_code == 0 and "gpu.xid" in r.output
    r = CliRunner().invoke(main, ["rules", "test"])
    assert r.exit_code == 0 and " 0 problems" in r.output
    bad = tmp_path / "site" / "x.yaml"
    bad.parent.mkdir()
    bad.write_text("id: site.x\n")
    r = CliRunner().invoke(main, ["rules", "test", str(tmp_path)])
    assert r.exit_code == 1 and "FAIL" in r.output


def test_config_command():
    r = CliRunner().invoke(main, ["config"])
    assert r.exit_code == 0 and "database = " in r.output and "env SATTRIB_DATABASE" in r.output


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, prefix + (name,))


@pytest.mark.parametrize("path", [p for p, c in _commands(main) if not isinstance(c, click.Group)],
                         ids=lambda p: " ".join(p))
def test_every_command_has_help_with_examples(path):
    r = CliRunner().invoke(main, [*path, "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "sattrib" in r.output


def test_show_stays_light():
    """`sattrib <jobid>` is typed by people: it must not import the heavy parts."""
    assert run("demo").returncode == 0
    code = ("import sys\nfrom sattrib.cli import main\n"
            "try:\n    main(['1001'], prog_name='sattrib')\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('pydantic', 'sqlite_utils', 'sattrib.engine.pipeline', 're2', "
            "'hyperscan', 'yaml') if m in sys.modules]\nprint('HEAVY', heavy)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ))
    assert "HEAVY []" in r.stdout, r.stdout[-500:] + r.stderr[-500:]


def test_list_filters_like_sacct(tmp_path):
    db = tmp_path / "x.db"
    for name in ("xid48_ecc_nvidia_smi_xml", "cuda_oom_gpu_from_busid", "ib_port_down_roce",
                 "app_exception_fake_kernel_lines"):
        assert run("analyze", str(CASES / name), "--store", "--database", str(db)).returncode == 0

    def rows(*args):
        r = run("list", "-S", "2000-01-01", "--json", "--database", str(db), *args)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    everything = rows()
    assert len(everything) == 4
    assert [r["ended"] for r in everything] == sorted((r["ended"] for r in everything),
                                                      reverse=True)
    infra = rows("--infra")
    assert {r["category"] for r in infra} == {"gpu_memory_ecc", "network_ib"}
    assert [r["category"] for r in rows("--category", "cuda_oom")] == ["cuda_oom"]
    node = next(r["culprit_node"] for r in everything if r["category"] == "gpu_memory_ecc")
    assert node in {r["culprit_node"] for r in rows("--node", node)}
    assert rows("-S", "2999-01-01") == []
    r = run("list", "--database", str(db), "-S", "2000-01-01")
    assert r.stdout.splitlines()[0].split()[:3] == ["ENDED", "(UTC)", "JOBID"]
    assert len(r.stdout.splitlines()) == 5
    r = run("list", "--database", str(db), "-S", "2000-01-01", "-P")
    assert r.stdout.splitlines()[0].startswith("ENDED (UTC)|JOBID|USER|PARTITION|STATE|")
    r = run("hotspots", "-S", "2000-01-01", "--json", "--database", str(db))
    hot = json.loads(r.stdout)
    assert {h["node"] for h in hot} == {r["culprit_node"] for r in infra}
    oom = next(r for r in everything if r["category"] == "cuda_oom")
    assert oom["culprit_gpu"]
    r = run("hotspots", "--gpu", "-S", "2000-01-01", "--json", "--database", str(db))
    assert (oom["culprit_node"], oom["culprit_gpu"]) not in {
        (h["node"], h["gpu"]) for h in json.loads(r.stdout)}       # a user's OOM: not the GPU's
    r = run("list", "--database", str(db), "-S", "last tuesday")
    assert r.returncode == 1 and "cannot read the time" in r.stderr and "hint:" in r.stderr


def test_missing_evidence_is_hostlist_compressed():
    from sattrib.render import render
    d = {"job_id": "1", "outcome": "unattributed", "action": "collect", "rules_version": "r",
         "engine_version": "e", "completeness": {"missing": [
             "gpu:node-01", "gpu:node-02", "gpu:node-03", "kernel:node-02", "scheduler:job"]}}
    line = next(ln for ln in render(d).splitlines() if ln.startswith("Missing evidence"))
    assert line == "Missing evidence: gpu:node-[01-03], kernel:node-02, scheduler:job"


def test_serve_on_a_busy_port_is_one_line(tmp_path):
    import socket
    assert run("demo", env={"SATTRIB_DATABASE": str(tmp_path / "d.db")}).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run("serve", "--port", str(port), "--database", str(tmp_path / "d.db"))
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines()[0] == f"sattrib: error: port {port} on 127.0.0.1 is already in use"
    assert "Traceback" not in r.stderr


OSC52 = "\x1b]52;c;ZWNobyBwd25lZA==\x07"          # a clipboard write
CLEAR = "\x1b[2J"


def test_what_users_wrote_reaches_the_terminal_escaped(tmp_path):
    """A job name holding an OSC 52 clipboard write and a clear-screen, an output file named
    with one, a partition that reads as a formula: `analyze`, `JOBID`, `list` and `list -P`
    show the escapes as text, and -P defuses the formula."""
    folder = tmp_path / "job"
    (folder / "slurm").mkdir(parents=True)
    (folder / "slurm" / "job.txt").write_text(
        f"JobId=7100 JobName=x{OSC52}{CLEAR}\n   UserId=alice(1000) GroupId=a(1)\n"
        "   JobState=FAILED Reason=NonZeroExitCode\n   Restarts=0 ExitCode=1:0\n"
        "   StartTime=2026-11-02T09:00:00 EndTime=2026-11-02T10:30:00\n"
        "   Partition=-2+3+cmd|calc\n   NodeList=node-01\n")
    (folder / "node-01").mkdir()
    (folder / "node-01" / f"rank-0{CLEAR}.err").write_text("[rank0]: ValueError: bad\n")
    db = str(tmp_path / "d.db")
    outs = []
    for args in (["analyze", str(folder), "--store", "--database", db], ["7100", "--database", db],
                 ["list", "-S", "2000-01-01", "--database", db],
                 ["list", "-S", "2000-01-01", "-P", "--database", db],
                 ["analyze", str(folder), "--json"]):
        r = run(*args)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout, args
        outs.append(r.stdout)
    analyzed, shown, listed, parsable, as_json = outs
    for out in (analyzed, shown):
        assert "Job 7100  x\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J, user alice" in out
        assert "e1 node-01/rank-0\\x1b[2J.err:1" in out
    assert "|'-2+3+cmd/calc|" in parsable and " -2+3+cmd|calc " in listed
    assert json.loads(as_json)["job"]["name"] == f"x{OSC52}{CLEAR}"    # JSON keeps the value


def test_file_line_names_the_file_the_job_wrote(tmp_path):
    """A job's output is read from the bundle's copy (logs/output-000.txt); `sattrib JOBID`
    names the file the job wrote, from sattrib's own record of the run in the bundle."""
    from sattrib.analysis import analyze_folder
    from sattrib.store import Store
    d, _ = analyze_folder(CASES / "same_exception_every_rank")
    copies = sorted({e.path for e in d.evidence if e.trust.value == "job_output"})
    assert copies
    bundle = tmp_path / "bundle"
    (bundle / "slurm").mkdir(parents=True)
    written = {c: f"/home/alice/run/out-{i}.txt" for i, c in enumerate(copies)}
    (bundle / "slurm" / "sattrib-run.json").write_text(json.dumps(
        {"outputs": [{"copy": c, "source": s} for c, s in written.items()]}))
    db = tmp_path / "d.db"
    Store(db).upsert(d, "c1", bundle_path=str(bundle))
    r = run(d.job_id, "--database", str(db), "--json")
    assert r.returncode == 0, r.stderr
    got = {e["path"]: e.get("source_path") for e in json.loads(r.stdout)["evidence"]}
    assert {p: got[p] for p in copies} == written
    r = run(d.job_id, "--database", str(db))
    assert "/home/alice/run/out-" in r.stdout and not any(c in r.stdout for c in copies)
