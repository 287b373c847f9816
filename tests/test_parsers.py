"""Pure parsers on recorded real tool output (tests/data/samples, licences beside them)."""
from pathlib import Path

import pytest

from sattrib.collectors import ibstat, nvidia_smi, slurm_state
from sattrib.engine.hostlist import compress, expand

DATA = Path(__file__).parent / "data" / "samples"


def facts(kind, name):
    text = (DATA / name).read_text()
    assert nvidia_smi.sniff(text[:65536]) == kind
    return [f for _, _, f in nvidia_smi.PARSERS[kind](text)]


def test_smi_q_healthy_h100_has_eight_gpus_and_zero_ecc():
    fs = facts("q", "nvidia-smi-q.h100-8gpu.535.161.08.healthy.txt")
    gpus = {f.split()[0] for f in fs if f.startswith("gpu=")}
    assert len(gpus) == 8
    assert "driver_version=535.161.08" in fs
    dbe = [f for f in fs if "ecc_errors.volatile" in f and "uncorrectable" in f]
    assert dbe and all(f.endswith("=0") for f in dbe)


def test_smi_q_line_numbers_point_at_the_field():
    text = (DATA / "nvidia-smi-q.h100-8gpu.535.161.08.healthy.txt").read_text()
    lines = text.split("\n")
    for n, orig, fact in nvidia_smi.facts_from_q(text):
        assert lines[n - 1] == orig


def test_smi_q_truncated_does_not_crash():
    fs = facts("q", "nvidia-smi-q.h100-8gpu.535.183.01.truncated.txt")
    assert fs and any(f.startswith("gpu=") for f in fs)


def test_smi_page_retirement_pending():
    fs = facts("q", "nvidia-smi-q-d-page_retirement.azure-nd-8gpu.EDITED-faults.txt")
    assert any(f.endswith("retired_pages.pending_page_blacklist=Yes") for f in fs)


def test_smi_xml():
    fs = facts("xml", "nvidia-smi-q-x.a10g-1gpu.515.105.01.xml")
    assert any(f.startswith("gpu=0000:00:1e.0 ") or f.startswith("gpu=") for f in fs)
    assert any(".ecc_errors.volatile." in f or "ecc_errors.volatile." in f for f in fs)
    assert "driver_version=515.105.01" in fs


def test_smi_xml_ignores_entities_and_survives_truncation():
    bomb = ('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
            '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><nvidia_smi_log><gpu id="00000000:01:00.0">'
            '<product_name>&b;</product_name><ecc_errors><volatile><dram_uncorrectable>1')
    out = list(nvidia_smi.facts_from_xml(bomb))
    assert out[-1][2] == "xml=truncated"


def test_smi_csv_with_na_fields():
    fs = facts("csv", "nvidia-smi-query-gpu.t4-1gpu.550.54.15.NA-fields.EDITED.csv")
    assert "gpu=0001:01:00.0 ecc.errors.uncorrected.volatile.total=5" in fs
    assert "gpu=0001:01:00.0 temperature.memory=N/A" in fs


def test_smi_error_output_passes_through():
    assert nvidia_smi.sniff("Failed to initialize NVML: Driver/library version mismatch\n") == "error"


def test_ibstat_some_down():
    text = (DATA / "ibstat.h100-node-12hca.some-down.txt").read_text()
    fs = [f for _, _, f in ibstat.facts(text)]
    down = [f for f in fs if "state=Down" in f]
    assert down and all(f.startswith("ib hca=") for f in fs)
    assert len(fs) == text.count("Port 1:") + text.count("Port 2:")


def test_ibstat_all_active_and_sysfs():
    for name in ("ibstat.h100-node-8xcx7-ib-bf3.all-active.txt",
                 "sysfs-class-infiniband.h100-node.flat.txt"):
        text = (DATA / name).read_text()
        assert ibstat.sniff(text)
        fs = [f for _, _, f in ibstat.facts(text)]
        states = [f for f in fs if " state=" in f]
        assert states and all("state=Active" in f for f in states), name


def test_rdma_link_readings_are_port_states_one_per_reading():
    """iproute2's `rdma link`, polled while a port flapped: each reading is a state, in
    ibstat's words."""
    text = ("link mlx5_7/1 subnet_prefix fe80:0000:0000:0000 lid 3403 sm_lid 1 lmc 0 state DOWN "
            "physical_state POLLING\n"
            "link mlx5_7/1 subnet_prefix fe80:0000:0000:0000 lid 3403 sm_lid 1 lmc 0 state ACTIVE "
            "physical_state LINK_UP netdev ib7\n")
    assert ibstat.sniff(text)
    assert [(n, f) for n, _, f in ibstat.facts(text)] == [
        (1, "ib hca=mlx5_7 port=1 state=Down phys=Polling"),
        (2, "ib hca=mlx5_7 port=1 state=Active phys=LinkUp")]
    assert not ibstat.sniff("link is up\nstate DOWN physical_state POLLING\n")


def test_scontrol_show_job_d():
    jobs = slurm_state.parse_scontrol((DATA / "scontrol-show-job-d.8node-64gpu.running.txt").read_text())
    assert len(jobs) == 1
    j = jobs[0]
    assert j.job_id and j.state == "RUNNING" and len(j.nodes) == 8 and j.start


def test_sacct_with_invalid_lines_does_not_crash():
    jobs = slurm_state.parse_sacct((DATA / "sacct-P.with-invalid-lines.txt").read_text())
    assert isinstance(jobs, list)


@pytest.mark.parametrize("expr,hosts", [
    ("node-[01-03]", ["node-01", "node-02", "node-03"]),
    ("gpu-a[017-018,020],login1", ["gpu-a017", "gpu-a018", "gpu-a020", "login1"]),
    ("cn[0405-0406]", ["cn0405", "cn0406"]),
    ("(null)", []),
    ("bad[1-x]", ["bad[1-x]"]),
])
def test_hostlist(expr, hosts):
    assert expand(expr) == hosts
    if hosts and "[" not in hosts[0]:
        assert expand(compress(hosts)) == sorted(hosts)
