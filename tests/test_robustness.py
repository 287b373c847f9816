"""Broken and hostile input: fuzzed parsers, cut files, a crowded folder, a shaky spool,
skewed clocks. Nothing raises, nothing hangs, the diagnosis stays right where evidence allows."""
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import CASES
from sattrib.analysis import analyze_folder
from sattrib.collectors import ibstat, nvidia_smi, slurm_state, spool
from sattrib.engine import hostlist, xid
from sattrib.engine.lineparse import SRUN, TimeContext, clean, parse_stamp_text, split_prefix

FUZZ = settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
text = st.text(alphabet=st.characters(codec="utf-8"), max_size=600) | st.sampled_from([
    "NVRM: Xid (PCI:0000:9d:00): 149, NETIR_LINK_EVT  Fatal XC0 i0 Link 07 (0x",
    "GPU 00000000:1B:00.0\n    ECC Errors\n        Volatile\n            DRAM Uncorrectable : ",
    "CA 'mlx5_0'\n\tPort 1:\n\t\tState: ", "JobId=1 JobState= NodeList=n[1-", "<gpu id=\"",
    "index, pci.bus_id\n0, 0000", "Dec 31 23:59:60 n kernel: ", "[rank-1]:[E9999 99:99:99"])


@FUZZ
@given(text)
def test_line_parsing_never_raises(s):
    p = split_prefix(clean(s), tags=SRUN)
    assert isinstance(p.message, str)
    TimeContext(1775988600.0).epoch(p.stamp)
    parse_stamp_text(s)


@FUZZ
@given(text)
def test_structured_parsers_never_raise(s):
    for parse in nvidia_smi.PARSERS.values():
        list(parse(s))
    list(ibstat.facts(s))
    slurm_state.parse_scontrol(s)
    slurm_state.parse_sacct(s)
    slurm_state.parse_json(s)
    hostlist.expand(s)


@FUZZ
@given(st.integers(0, 400), text)
def test_xid_decode_never_raises(code, body):
    xid.classify(code, body)


@FUZZ
@given(text)
def test_rules_never_raise(rules, s):
    for c in rules.rules:
        m = c.search(s)
        if m:
            m.groupdict()


@settings(max_examples=25, deadline=20000, suppress_health_check=list(HealthCheck))
@given(st.binary(max_size=4000), st.binary(max_size=4000))
def test_whole_folder_on_random_bytes(rules, tmp_path_factory, a, b):
    case = tmp_path_factory.mktemp("fz")
    (case / "n1").mkdir()
    (case / "slurm").mkdir()
    (case / "n1" / "journal.log").write_bytes(a)
    (case / "n1" / "rank-0.stderr").write_bytes(b)
    (case / "slurm" / "job.txt").write_bytes(a[:200] + b"JobId=5 " + b[:200])
    d, _ = analyze_folder(case, rules=rules)
    assert d.outcome.value in ("attributed", "ambiguous", "unattributed")


def _copy(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(CASES / name, dst)
    return dst


def test_truncated_journal_json(tmp_path, rules):
    case = _copy(tmp_path, "journal_json_transport_trust")
    j = case / "j2" / "journal.jsonl"
    data = j.read_bytes()
    j.write_bytes(data + data[: len(data) // 3])        # a record cut in the middle
    d, _ = analyze_folder(case, rules=rules)
    assert d.root_cause.category.value == "gpu_memory_ecc" and d.root_cause.node == "j2"


def test_hundred_thousand_files(tmp_path, rules):
    case = _copy(tmp_path, "xid79_srun_combined_log")
    crowd = case / "gn01"
    for i in range(100_000):
        (crowd / f"w-{i:06d}.out").write_bytes(b"x\n")
    t0 = time.monotonic()
    d, _ = analyze_folder(case, rules=rules)
    assert time.monotonic() - t0 < 120
    assert d.root_cause.node == "gn02"
    assert any("100001 entries" in n or "entries, read" in n for n in d.completeness.notes)


def _shift_node_clock(case: Path, node: str, seconds: int):
    from datetime import datetime, timedelta
    p = case / node / "journal.log"
    out = []
    for line in p.read_text().splitlines():
        head, rest = line[:15], line[15:]
        try:
            t = datetime.strptime("2026 " + head, "%Y %b %d %H:%M:%S") + timedelta(seconds=seconds)
            out.append(t.strftime("%b %d %H:%M:%S") + rest)
        except ValueError:
            out.append(line)
    p.write_text("\n".join(out) + "\n")


@pytest.mark.parametrize("skew", [-240, -90, 90, 240])
def test_node_clock_skewed_by_minutes(tmp_path, rules, skew):
    case = _copy(tmp_path, "xid79_srun_combined_log")
    _shift_node_clock(case, "gn02", skew)               # the culprit's own clock is off
    d, _ = analyze_folder(case, rules=rules)
    assert (d.root_cause.category.value, d.root_cause.node) == ("gpu_hardware", "gn02")
    case2 = _copy(tmp_path / "b", "ib_port_down_roce")
    for node in ("r1n1", "r1n2"):
        _shift_node_clock(case2, node, skew if node == "r1n1" else -skew)
    d2, _ = analyze_folder(case2, rules=rules)
    assert (d2.root_cause.category.value, d2.root_cause.node) == ("network_ib", "r1n1")


# -- the spool --------------------------------------------------------------------------------


def _snap(node="n1", job="77", restart=0):
    return {"format": spool.FORMAT, "job_id": job, "restart": restart, "node": node,
            "files": {"journal.jsonl": ""}, "probes": []}


def test_spool_rejects_and_accepts(tmp_path):
    sp = tmp_path / "spool"
    dl = time.monotonic() + 10
    p = spool.write_snapshot(sp, "c", "77", 0, "n1", _snap(), dl, munge=False)
    spool.write_snapshot(sp, "c", "77", 0, "n2", _snap("n3"), dl, munge=False)   # wrong node
    spool.write_snapshot(sp, "c", "77", 0, "n4", _snap("n4", job="78"), dl, munge=False)
    cut = spool.write_snapshot(sp, "c", "77", 0, "n5", _snap("n5"), dl, munge=False)
    cut.write_bytes(cut.read_bytes()[:20])                                        # cut short
    user = spool.write_snapshot(sp, "c", "77", 0, "n6", _snap("n6"), dl, munge=False)
    os.chown(user, 1000, 1000)                                                    # not root
    os.symlink("/etc/shadow", p.parent / "n7.snap.gz")
    notes = []
    got = spool.read_snapshots(p.parent, "77", 0, {0}, False, dl, notes)
    assert sorted(got) == ["n1"]
    text = "\n".join(notes)
    for needle in ("from n2 rejected: it is for job 77.0 on n3", "from n4 rejected: it is for job 78",
                   "from n5 rejected: cut or corrupt", "from n6 rejected: owned by uid 1000",
                   "from n7 rejected: is a symbolic link"):
        assert needle in text


def test_spool_second_snapshot_replaces_the_first(tmp_path):
    sp = tmp_path / "spool"
    dl = time.monotonic() + 10
    a = _snap()
    a["files"] = {"journal.jsonl": "first"}
    spool.write_snapshot(sp, "c", "77", 0, "n1", a, dl, munge=False)
    a["files"] = {"journal.jsonl": "second"}
    p = spool.write_snapshot(sp, "c", "77", 0, "n1", a, dl, munge=False)
    got = spool.read_snapshots(p.parent, "77", 0, {0}, False, dl, [])
    assert got["n1"].data["files"]["journal.jsonl"] == "second"
    assert [f.name for f in p.parent.iterdir()] == ["n1.snap.gz"]


def test_spool_requires_munge_when_configured(tmp_path):
    dl = time.monotonic() + 10
    p = spool.write_snapshot(tmp_path, "c", "77", 0, "n1", _snap(), dl, munge=False)
    notes = []
    assert spool.read_snapshots(p.parent, "77", 0, {0}, True, dl, notes) == {}
    assert "no MUNGE credential" in notes[0]


def test_spool_unsafe_names(tmp_path):
    with pytest.raises(spool.SpoolError):
        spool.job_dir(tmp_path, "../x", "1", 0)
    with pytest.raises(spool.SpoolError):
        spool.write_snapshot(tmp_path, "c", "1", 0, "../../etc/n", _snap(), time.monotonic() + 5,
                             munge=False)


def test_epilog_survives_disk_full_and_missing_spool(tmp_path, monkeypatch, caplog):
    from sattrib.slurm_hooks import epilog
    cfg = tmp_path / "s.toml"
    cfg.write_text(f'spool_dir = "{tmp_path}/no/such/parent/spool"\nspool_auth = "owner"\n'
                   'epilog_budget_s = 5.0\nprobe_timeout_s = 1.0\n')
    # The hook reads its settings from the environment it is given (SATTRIB_CONFIG only).
    env = {"SLURM_JOB_ID": "9", "SLURM_JOB_EXIT_CODE": "256", "SLURMD_NODENAME": "n1",
           "SLURM_JOB_RESTART_COUNT": "0", "SATTRIB_CONFIG": str(cfg)}
    real_write = os.write

    def full(fd, data):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "write", full)
    t0 = time.monotonic()
    assert epilog.main(env) == 0
    monkeypatch.setattr(os, "write", real_write)
    assert time.monotonic() - t0 < 10
    assert "epilog snapshot failed" in caplog.text and "No space left on device" in caplog.text
    spool_dir = tmp_path / "no" / "such" / "parent" / "spool"
    # No half-written snapshot left (the run's own mark, spool.claim_run, is no snapshot).
    assert not [p for p in spool_dir.rglob("*") if p.is_file() and ".epilog" not in p.parts]

