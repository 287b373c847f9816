"""Small things a user meets first: the demo transcript in the README is the real output,
`sattrib JOBID` fits an 80-column terminal, a typo'd category names the valid ones, a failed
`serve` leaves nothing behind."""
import os
import re
import socket
import subprocess
import sys

from click.testing import CliRunner

from helpers import ROOT
from sattrib.cli import main

STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|E\d{4} \d\d:\d\d:\d\d\.\d+|"
                   r"stored in \S+;|rules sha256:\S+  engine \S+")


def cli(*args):
    return CliRunner().invoke(main, list(args), env={"NO_COLOR": "1"})


def _same(line: str) -> str:
    return STAMP.sub("~", line)


def test_the_readmes_demo_transcript_is_the_real_output():
    text = (ROOT / "README.md").read_text()
    block = text.split("```text\n$ sattrib demo\n", 1)[1].split("```", 1)[0].splitlines()
    real = [_same(x) for x in cli("demo").output.splitlines()]
    at = 0
    for line in block:
        if line.strip() == "...":                     # lines left out of the transcript
            continue
        assert _same(line) in real[at:], f"README line not in the output (in order): {line}"
        at = real.index(_same(line), at) + 1
    assert len([x for x in block if x.strip() != "..."]) > 20


def test_sattrib_jobid_fits_80_columns():
    assert cli("demo").exit_code == 0
    r = cli("1001")
    assert r.exit_code == 0 and r.output.startswith("Job 1001")
    wide = [x for x in r.output.splitlines() if len(x) > 80]
    assert not wide, wide
    assert any(x.startswith("  e1 node-02/journal.log:6: ") for x in r.output.splitlines())


def test_a_typod_category_names_the_valid_ones():
    assert cli("demo").exit_code == 0
    r = cli("list", "--category", "gpu-hardware")
    assert r.exit_code == 1
    lines = r.output.splitlines()
    assert lines[0] == "sattrib: error: unknown category 'gpu-hardware'"
    assert lines[1].startswith("hint: did you mean gpu_hardware? one of: gpu_hardware, ")
    assert "scheduler_cancelled" in lines[1]
    assert "1001" in cli("list", "--category", "nvlink").output


def test_a_failed_serve_leaves_no_temporary_folder(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), SATTRIB_DATABASE=str(tmp_path / "d.db"))
    run = [sys.executable, "-m", "sattrib"]
    assert subprocess.run(run + ["demo"], env=env, capture_output=True, timeout=120).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = subprocess.run(run + ["serve", "--port", str(s.getsockname()[1])], env=env,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "already in use" in r.stderr
    assert os.listdir(tmp) == []
