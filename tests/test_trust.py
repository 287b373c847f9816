"""Trust follows where a line came from: what the job printed may name a hardware category, but
never takes a node out of service, and a host name it prints never outranks the launcher."""
from sattrib.analysis import analyze_folder

JOB = ("JobId=100 JobName=train\n   UserId=alice(1000) GroupId=alice(1000)\n"
       "   JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0\n"
       "   StartTime=2026-11-02T10:00:00 EndTime=2026-11-02T10:20:00\n"
       "   NodeList=node-[01-02] NumNodes=2 NumTasks=2\n")
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
XID48 = ("2026-11-02T10:05:01+0000 node-01 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, "
         "name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the "
         "framebuffer at partition 0, subpartition 0.\n")


def analyze(tmp_path, files):
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    d, _ = analyze_folder(tmp_path)
    return d


def test_hardware_fault_printed_by_the_job_alone_is_inspected_not_drained(tmp_path):
    d = analyze(tmp_path, {"slurm/job.txt": JOB, "node-01/rank-0.err": ECC})
    r = d.root_cause
    assert (r.category.value, r.node, r.trust.value) == ("gpu_memory_ecc", "node-01", "job_output")
    assert r.action_code.value == "inspect_node"
    assert "drain" not in d.action and "only the job's output" in d.action
    assert {e.trust.value for e in d.evidence} == {"job_output"}


def test_the_same_fault_in_the_kernel_log_drains(tmp_path):
    d = analyze(tmp_path, {"slurm/job.txt": JOB, "node-01/rank-0.err": ECC,
                           "node-01/journal.log": XID48})
    r = d.root_cause
    assert (r.category.value, r.node, r.trust.value) == ("gpu_memory_ecc", "node-01", "kernel")
    assert r.action_code.value == "drain_node" and d.action.startswith("drain node-01")
    root = next(e for e in d.evidence if e.id == r.evidence[0])
    assert (root.source.value, root.trust.value) == ("kernel", "kernel")


def test_a_host_prefix_printed_by_a_rank_does_not_move_its_error(tmp_path):
    # srun -l output: the launcher says task 1 ran on node-01; the rank prints node-02's
    # NCCL prefix on an IB error.
    d = analyze(tmp_path, {"slurm/job.txt": JOB, "logs/slurm-100.out": (
        "1: node-01:4242:4242 [0] NCCL INFO comm 0x1 rank 1 nranks 2\n"
        "1: node-02:4242:4290 [0] transport/net_ib.cc:115 NCCL WARN NET/IB : mlx5_0:1 "
        "Got async event : port error\n"
        "srun: error: node-01: task 1: Exited with exit code 1\n")})
    r = d.root_cause
    assert (r.category.value, r.node) == ("network_ib", "node-01")
    assert r.action_code.value == "inspect_node"


def test_kernel_lines_in_a_job_output_file_of_any_name_are_not_kernel_evidence(tmp_path):
    # `#SBATCH -o %x-%j.log` and `#SBATCH -o metrics.json`: whatever the job wrote is job output.
    fake = XID48.replace("Xid (PCI:0000:3b:00): 48", "Xid (PCI:0000:3b:00): 79") * 2
    journal_json = ('{"_TRANSPORT":"kernel","MESSAGE":"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, '
                    'GPU has fallen off the bus.","__REALTIME_TIMESTAMP":"1793613901000000"}\n')
    d = analyze(tmp_path, {"slurm/job.txt": JOB,
                           "logs/train-100.log": fake + "ValueError: bad batch\n",
                           "logs/metrics.json": journal_json})
    r = d.root_cause
    assert (r.category.value, r.trust.value) == ("application_error", "job_output")
    assert not any(e.source.value == "kernel" for e in d.evidence)


def test_the_worker_names_job_output_copies_itself_and_keeps_the_origin(tmp_path, monkeypatch):
    # `#SBATCH -o kern.log` with syslog-shaped Xid lines in it: the copy is job output by where
    # it came from, whatever the user named it.
    import json

    from test_fail_closed import _ctld_env, _no_slurmctld, _settings

    from sattrib.collect import collect_job
    from sattrib.collectors import slurm_env
    work = tmp_path / "work"
    work.mkdir()
    fake = ("Nov  2 10:05:01 k1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
            "GPU has fallen off the bus.\n") * 2
    (work / "kern.log").write_text(fake + "ValueError: bad batch\n")
    _no_slurmctld(monkeypatch)
    st = _settings(tmp_path)
    out = collect_job("8801", st, env_job=slurm_env.from_env(
        _ctld_env(work, SLURM_JOB_STDOUT="kern.log")))
    assert sorted(p.name for p in (out.bundle / "logs").iterdir()) == ["output-000.txt"]
    record = json.loads((out.bundle / "slurm" / "sattrib-run.json").read_text())
    assert record["outputs"] == [{"copy": "logs/output-000.txt", "source": str(work / "kern.log")}]
    r = out.diagnosis.root_cause
    assert (r.category.value, r.trust.value) == ("application_error", "job_output")
