"""How the verdict reads real evidence: cancels, causes of last resort, the Xid catalog's
actions, hardware over program faults, message catalogs. Each test builds a small evidence
folder with lines in the shapes the emitters print."""
import pytest

from helpers import folder
from sattrib.analysis import analyze_folder
from sattrib.engine.catalog import CatalogError, read_catalog
from sattrib.engine.rules import RuleError, load_rules


def run(tmp_path, files, rules):
    d, _ = analyze_folder(folder(tmp_path, files), rules=rules)
    return d


def cause(d):
    r = d.root_cause
    return (d.outcome.value, r.category.value if r else None, r.node if r else None)


def test_bare_step_cancel_after_a_task_failure_is_teardown(tmp_path, rules):
    d = run(tmp_path, {"logs/job.out": (
        "srun: error: node-01: task 5: Exited with exit code 1\n"
        "srun: launch/slurm: _step_signal: Terminating StepId=43575862.0\n"
        "slurmstepd: error: *** STEP 43575862.0 ON node-01 CANCELLED AT 2021-07-14T08:00:36 ***\n"
        "srun: error: node-01: tasks 3,7: Killed\n"
        "srun: error: node-02: tasks 9-10,12-15: Killed\n")}, rules)
    # The cancel and the kills are srun's teardown of the step after task 5 exited: Slurm's own
    # sequence says that task's failure ended it.
    assert cause(d) == ("attributed", "application_error", "node-01")
    assert d.root_cause.rank == 5


def test_a_lone_exit_code_is_a_possible_program_failure(tmp_path, rules):
    # With no teardown after it, a task's exit code says the program failed there, not why.
    d = run(tmp_path, {"logs/job.out": (
        "srun: error: node-01: task 5: Exited with exit code 1\n"
        "srun: error: node-02: tasks 8-15: Aborted (core dumped)\n")}, rules)
    assert cause(d) == ("unattributed", None, None)
    assert possible(d) == [("application_error", "node-01")]


def test_memory_enforcement_then_bare_cancel_is_host_oom(tmp_path, rules):
    d = run(tmp_path, {"node-01/job.out": (
        "slurmstepd: error: Job 7518 exceeded memory limit (626359956 > 512000000), being killed\n"
        "slurmstepd: error: Exceeded job memory limit\n"
        "slurmstepd: error: *** JOB 7518 ON node-01 CANCELLED AT 2022-06-10T17:11:35 ***\n")},
        rules)
    assert cause(d) == ("attributed", "host_oom", "node-01")
    assert d.action_code.value == "reduce_host_memory"


def possible(d):
    return [(c.category.value, c.node) for c in d.possible]


def test_bare_cancel_alone_is_a_possible_cancel_not_a_proven_one(tmp_path, rules):
    # Slurm prints the same banner for a user's scancel and for srun or the memory enforcement
    # ending the step: without the scheduler's record of who cancelled it proves nothing.
    d = run(tmp_path, {"logs/slurm-1.out": (
        "step 100 loss 1.25\n"
        "slurmstepd: error: *** JOB 1 ON node-01 CANCELLED AT 2025-10-02T14:03:27 ***\n")}, rules)
    assert cause(d) == ("unattributed", None, None)
    assert possible(d) == [("scheduler_cancelled", None)]
    assert "not proven" in d.action


def test_recorded_cancel_makes_later_errors_teardown(tmp_path, rules):
    d = run(tmp_path, {
        "slurm/sacct.txt": ("JobID|JobName|State|ExitCode\n"
                            "1|train|CANCELLED by 41022|0:0\n"),
        "logs/slurm-1.out": (
            "slurmstepd: error: *** JOB 1 ON node-01 CANCELLED AT 2025-10-02T14:03:27 ***\n"
            "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Terminated.\n")},
        rules)
    assert cause(d) == ("attributed", "scheduler_cancelled", None)


def test_every_node_exiting_with_an_error_names_no_culprit(tmp_path, rules):
    lines = "".join(f"srun: error: node-{i:02d}: tasks {8*i}-{8*i+7}: Exited with exit code 1\n"
                    for i in range(1, 5))
    d = run(tmp_path, {"logs/job.out": lines}, rules)
    assert d.outcome.value == "unattributed"


def test_watchdog_abort_is_not_a_crash(tmp_path, rules):
    d = run(tmp_path, {"logs/job.out": "srun: error: node-01: tasks 0-7: Aborted (core dumped)\n"},
            rules)
    assert d.outcome.value == "unattributed"


def test_segfault_of_one_task_is_the_cause_of_last_resort(tmp_path, rules):
    d = run(tmp_path, {"logs/job.out": (
        "srun: error: node-02: task 9: Segmentation fault (core dumped)\n"
        "srun: error: node-01: tasks 0-7: Killed\n")}, rules)
    assert cause(d) == ("attributed", "application_error", "node-02")


RESET = ("node-01:3205267:3205779 [5] misc/socket.cc:49 NCCL WARN socketProgressOpt: Call to "
         "recv from 172.24.16.5<59590> failed : Connection reset by peer\n")


def test_connection_reset_with_no_crash_is_the_network(tmp_path, rules):
    d = run(tmp_path, {"logs/job.out": RESET}, rules)
    assert d.outcome.value == "attributed" and d.root_cause.category.value == "network_ib"
    assert d.evidence[0].rule == "nccl.socket_error"


def test_connection_reset_after_a_rank_crashed_is_no_proof_of_the_network(tmp_path, rules):
    # The rank's CUDA error names no cause alone, but a dead process explains its peer's reset.
    d = run(tmp_path, {"logs/job.out": (
        "36: RuntimeError: CUDA error: unknown error\n" + RESET)}, rules)
    assert d.outcome.value == "unattributed"
    assert "network_ib" in [c for c, _ in possible(d)]


def test_connection_reset_beside_a_crash_is_the_crash(tmp_path, rules):
    d = run(tmp_path, {"logs/job.out": RESET + "srun: error: node-02: task 9: Segmentation fault\n"},
            rules)
    assert cause(d) == ("attributed", "application_error", "node-02")


KLOG = "Nov 02 10:14:07 node-01 kernel: NVRM: Xid (PCI:0000:3b:00): "
JOB = ("JobId=9 JobName=t\n   JobState=FAILED Reason=NonZeroExitCode\n"
       "   StartTime=2025-11-02T09:00:00 EndTime=2025-11-02T10:20:00\n   NodeList=node-01\n")


def test_hardware_xid_outranks_the_application_xid_it_caused(tmp_path, rules):
    d = run(tmp_path, {"slurm/job.txt": JOB, "node-01/journal.log": (
        KLOG + "31, pid=4242, name=python, Ch 00000008, intr 00000000. MMU Fault: ENGINE "
        "GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f_12340000. Fault is of type FAULT_PDE\n" +
        KLOG + "48, pid=4242, name=python, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 6, subpartition 0.\n")}, rules)
    assert cause(d) == ("attributed", "gpu_memory_ecc", "node-01")
    assert "Xid 48" in d.root_cause.summary


def test_restart_the_application_xid_never_drains(tmp_path, rules):
    d = run(tmp_path, {"slurm/job.txt": JOB, "node-01/journal.log":
                       KLOG + "32, pid=4242, name=python, Channel ID 00000010 intr 00040000\n"},
            rules)
    assert d.outcome.value == "attributed"
    assert d.action_code.value == "resubmit" and "drain" not in d.action


def test_fallen_off_the_bus_banner_is_one_cause(tmp_path, rules):
    d = run(tmp_path, {"node-01/dmesg.txt": (
        "[  512.123465] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has "
        "fallen off the bus.\n"
        "[  512.123470] NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n"
        "[  512.123475] NVRM: A GPU crash dump has been created. If possible, please run\n")},
        rules)
    assert cause(d) == ("attributed", "gpu_hardware", "node-01")
    assert [e.role.value for e in d.evidence].count("root") == 1
    assert d.action_code.value == "reboot_node"


HEADER = "rule\tmatch\trole\tcategory\taction\tflags\texplained_by\temitter\tversion\texample\tnote\n"


def test_catalog_rows_are_validated(tmp_path):
    bad = tmp_path / "x.tsv"
    bad.write_text(HEADER + "nccl.warn\tfoo\tblame\t-\t-\t-\t-\tNVIDIA/nccl x.cc\tv1\tfoo\tn\n")
    with pytest.raises(CatalogError, match="x.tsv:2: role 'blame'"):
        read_catalog(bad, "x.tsv")
    bad.write_text(HEADER + "nccl.warn\tfoo\troot\t-\t-\t-\t-\tNVIDIA/nccl x.cc\tv1\tfoo\tn\n")
    with pytest.raises(CatalogError, match="a root row needs a category"):
        read_catalog(bad, "x.tsv")
    bad.write_text(HEADER + "nccl.warn\t(a)\\1\tsymptom\t-\t-\t-\t-\tNVIDIA/nccl x.cc\tv1\tfoo\tn\n")
    with pytest.raises(CatalogError, match="match"):
        read_catalog(bad, "x.tsv")


def test_catalog_row_for_an_unknown_rule_is_refused(tmp_path):
    (tmp_path / "site.tsv").write_text(
        HEADER + "no.such_rule\tfoo\tsymptom\t-\t-\t-\t-\tme site\tv1\tfoo\tn\n")
    with pytest.raises(RuleError, match="not a loaded rule"):
        load_rules([tmp_path])


def test_a_site_catalog_row_changes_what_a_message_means(tmp_path):
    (tmp_path / "site.tsv").write_text(
        HEADER + "nccl.socket_error\tConnection refused\troot\tnetwork_config\t-\tweak\t-\t"
        "site notes\tlocal\tsocketStartConnect: Connect to 10.0.0.9<43211> failed : Connection "
        "refused\tour firewall\n")
    rules = load_rules([tmp_path])
    d = run(tmp_path / "case", {"logs/job.out":
                                "socketStartConnect: Connect to 10.0.0.9<43211> failed : "
                                "Connection refused\n"}, rules)
    assert d.root_cause.category.value == "network_config"


def test_without_a_job_window_a_days_old_xid_does_not_explain_todays_crash(tmp_path, rules):
    d = run(tmp_path, {
        "node-01/journal.log": (
            "2025-03-01T02:00:00+0000 node-01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, "
            "name=python, GPU has fallen off the bus.\n"
            "2025-03-04T10:00:01+0000 node-01 kernel: Out of memory: Killed process 4242 "
            "(python) total-vm:99999999kB, anon-rss:88888888kB, file-rss:0kB, shmem-rss:0kB, "
            "UID:1000 pgtables:200000kB oom_score_adj:0\n")}, rules)
    assert cause(d) == ("attributed", "host_oom", "node-01")
    assert any("last burst" in n for n in d.completeness.notes)


ELASTIC = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2023-05-10_12:00:00
  host      : node-01
  rank      : 3 (local_rank: 3)
  exitcode  : {code} (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
============================================================
"""


@pytest.mark.parametrize("code,want", [("-11", "application_error"), ("1", "application_error"),
                                       ("-6", None), ("-15", None)])
def test_torchelastic_first_failure_is_a_cause_of_last_resort(tmp_path, rules, code, want):
    d = run(tmp_path, {"logs/train.log": ELASTIC.format(code=code)}, rules)
    if want is None:
        assert d.outcome.value == "unattributed"      # the watchdog's abort, or teardown
    else:
        assert cause(d) == ("attributed", want, "node-01") and d.root_cause.rank == 3


SACCT_OOM = ("JobID|JobName|Partition|Account|AllocCPUS|State|ExitCode\n"
             "4242|train|gpu|research|8|OUT_OF_MEMORY|0:125\n")


@pytest.mark.parametrize("files", [
    {"logs/train.log": ELASTIC.format(code="-9")},
    {"logs/job.out": "/var/spool/slurmd/job4242/slurm_script: line 31: 37987 Killed"
                     "                  nextPolish2 -t 8 -r a.bam asm.fa\n"},
    {"logs/job.out": "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.\n"},
], ids=["torchelastic", "bash", "dataloader"])
def test_a_sigkill_points_at_memory_and_the_memory_record_proves_it(tmp_path, rules, files):
    """SIGKILL is most often the OOM killer, but an admin, a watchdog or a launcher sends it
    too: alone it leaves host memory possible; the scheduler's OUT_OF_MEMORY proves it."""
    d = run(tmp_path / "alone", files, rules)
    assert d.outcome.value == "unattributed"
    assert [c.category.value for c in d.possible] == ["host_oom"]
    d = run(tmp_path / "record", {**files, "slurm/sacct.txt": SACCT_OOM}, rules)
    assert cause(d)[:2] == ("attributed", "host_oom")


def test_torchelastic_first_failure_yields_to_the_ranks_own_error(tmp_path, rules):
    d = run(tmp_path, {"logs/train.log": "[rank3]: torch.OutOfMemoryError: CUDA out of memory. "
                       "Tried to allocate 2.00 GiB. GPU 3 has a total capacity of 79.15 GiB\n"
                       + ELASTIC.format(code="1")}, rules)
    assert d.root_cause.category.value == "cuda_oom"


TRACE = ('Traceback (most recent call last):\n  File "/home/u/packed.py", line 118, in pack\n'
         '    x = y[i]\nIndexError: list index out of range\n')


def test_only_slurm_out_names_job_and_the_task_srun_saw_fail(tmp_path, rules):
    d = run(tmp_path, {"slurm-8812245.out": TRACE +
                       "srun: error: gn07: task 0: Exited with exit code 1\n"}, rules)
    assert d.job_id == "8812245"
    assert cause(d) == ("attributed", "application_error", "gn07") and d.root_cause.rank == 0


def test_two_failing_tasks_on_two_nodes_place_no_unranked_error(tmp_path, rules):
    d = run(tmp_path, {"slurm-8812245.out": TRACE +
                       "srun: error: gn07: task 0: Exited with exit code 1\n"
                       "srun: error: gn08: task 1: Exited with exit code 1\n"}, rules)
    assert cause(d) == ("attributed", "application_error", None)     # not a guess between two
    assert d.root_cause.rank is None
    assert d.root_cause.summary == "a rank raised IndexError"          # no "?", no message


def test_a_rank_that_died_first_is_named_beside_its_peers_network_errors(tmp_path, rules):
    # Rank 36 loses its GPU; 30 s later rank 44 on another node sees its peer's HCA stop
    # answering. Neither line proves its cause, and the crash came first: both are possible,
    # the crash first, and nothing is attributed to the node that only reported its peer.
    d = run(tmp_path, {"logs/job.out": (
        "36: [rank36]:[E1014 03:51:29.134902082 ProcessGroupNCCL.cpp:1601] [PG ID 0 PG GUID 0"
        "(default_pg) Rank 36] Process group watchdog thread terminated with exception: CUDA "
        "error: unknown error\n"
        "44: gpu-a022:329330:329718 [4] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got "
        "completion from peer 10.12.1.21<42663> with status=12 opcode=0 len=0 vendor err 129\n"),
        "slurm/job.txt": ("JobId=1 JobName=t\n   JobState=FAILED Reason=NonZeroExitCode\n"
                          "   NodeList=gpu-a[021-022]\n")}, rules)
    assert d.outcome.value == "unattributed"
    assert [c for c, _ in possible(d)] == ["gpu_hardware", "network_ib"]


def test_enospc_on_dev_shm_is_host_memory_not_a_filesystem(tmp_path, rules):
    # The path names the resource: /dev/shm is shared memory (a container's 64 MB default),
    # a checkpoint directory is a filesystem.
    line = "OSError: [Errno 28] No space left on device: '{}'\n"
    d = run(tmp_path, {"logs/job.out": line.format("/dev/shm/torch_4432_2873_0")}, rules)
    assert cause(d)[:2] == ("attributed", "host_oom")
    hits = {e.rule: e.category for e in d.evidence}
    assert hits.get("storage.disk_full") == "host_oom"
    d = run(tmp_path / "b", {"logs/job.out": line.format("/scratch/ckpt/model.pt")}, rules)
    assert cause(d)[:2] == ("attributed", "storage_io")


@pytest.mark.parametrize("line", [
    "RuntimeError: ncclCommInitRank failed: unhandled cuda error",
    "RuntimeError: NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system "
    "error, NCCL version 2.7.8",
    "cupy.cuda.nccl.NcclError: NCCL_ERROR_UNHANDLED_CUDA_ERROR: unhandled cuda error",
])
def test_an_nccl_result_in_older_words_is_no_program_bug(tmp_path, rules, line):
    # Before 2.18 ncclGetErrorString said only "unhandled cuda error": which kind of call
    # failed inside NCCL, not why. The exception carrying it is not the program's own fault.
    d = run(tmp_path, {"logs/job.out": line + "\n"}, rules)
    assert d.outcome.value == "unattributed" and not d.possible


CUDA_220 = ("[rank8]:[E0611 12:40:52.534006050 ProcessGroupNCCL.cpp:1601] [PG ID 0 PG GUID "
            "0(default_pg) Rank 8] Process group watchdog thread terminated with exception: "
            "CUDA error: uncorrectable NVLink error detected during the execution\n")


def test_cuda_220_in_job_output_points_at_nvlink_and_the_kernels_xid_proves_it(tmp_path, rules):
    """CUDA's uncorrectable NVLink error names no link, every rank on the link prints it, and a
    peer that died mid-transfer leaves it too: alone it is a candidate; the driver's NVLink Xid
    on the node proves it."""
    d = run(tmp_path / "alone", {"node-01/rank-8.stderr": CUDA_220}, rules)
    assert d.outcome.value == "unattributed"
    assert [c.category.value for c in d.possible] == ["nvlink"]
    d = run(tmp_path / "xid", {
        "node-01/rank-8.stderr": CUDA_220,
        "node-01/journal.log": "2025-06-11T12:40:51.482913+00:00 node-01 kernel: NVRM: Xid "
                               "(PCI:0000:61:00): 74, pid=3422275, name=pt_main_thread, NVLink: "
                               "fatal error detected on link 4(0x10000, 0x0, 0x0, 0x0, 0x0, "
                               "0x0, 0x0)\n"}, rules)
    assert cause(d) == ("attributed", "nvlink", "node-01")


@pytest.mark.parametrize("lines", [
    "slurmstepd: error: container_p_join: open failed /scratch/119383/.active: No such file or "
    "directory\nslurmstepd: error: container_g_join failed: 119383\n",
    "slurmstepd: error: namespace_g_join(StepId=4242.0): No such file or directory\n",
    "slurmstepd: error: _spawn_job_container: container_g_stepd_create(4242): Permission denied\n",
])
def test_slurm_failing_to_enter_the_jobs_container_is_the_nodes_set_up(tmp_path, rules, lines):
    d = run(tmp_path, {"logs/job.err": lines}, rules)
    assert cause(d) == ("attributed", "scheduler_node_failure", None)


def test_a_c_programs_errno_and_strerror_name_the_filesystem(tmp_path, rules):
    # IOR and mdtest: "%s failed, errno %d, %s (%s:%d)"; MPI_Abort's "node 727" is a rank.
    d = run(tmp_path, {"logs/io500.out": (
        'ior ERROR: open64("/lustre/io500/mdt_hard/file.mdtest.727.10410", 66, 0664) failed, '
        "errno 28, No space left on device (aiori-POSIX.c:413)\n"
        "Abort(-1) on node 727 (rank 727 in comm 0): application called "
        "MPI_Abort(MPI_COMM_WORLD, -1) - process 727\n")}, rules)
    assert cause(d) == ("attributed", "storage_io", None)


def test_horovod_built_for_another_framework_version_is_the_jobs_software(tmp_path, rules):
    d = run(tmp_path, {"logs/mpirun.out": (
        "[1,1]<stderr>:horovod.common.exceptions.HorovodVersionMismatchError: Framework "
        "tensorflow installed with version 2.3.0 but found version 2.4.1.\n")}, rules)
    assert cause(d)[:2] == ("attributed", "software_incompat")
    assert d.root_cause.blame.value == "workload"


@pytest.mark.parametrize("banner", [
    "slurmstepd: error: *** JOB 830329 ON node-01 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME "
    "LIMIT ***",
    "slurmstepd: *** JOB 830329 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME LIMIT on node-01 ***",
    "slurmstepd: error: *** JOB 830329 CANCELLED AT 2018-08-06T17:21:44 DUE TO TIME LIMIT ***",
], ids=["since-15.08.13", "14.11-15.08", "2.0-14.03"])
def test_every_release_of_slurms_time_limit_banner_is_the_time_limit(tmp_path, rules, banner):
    d = run(tmp_path, {"logs/job.err": banner + "\n"}, rules)
    assert cause(d)[:2] == ("attributed", "scheduler_timelimit")


@pytest.mark.parametrize("line", [
    "slurmstepd: error: Detected 2 oom-kill event(s) in step 3756240.batch cgroup.",
    "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0 cgroup. Some of your "
    "processes may have been killed by the cgroup out-of-memory handler.",
])
def test_slurms_cgroup_oom_kill_count_is_host_memory_in_every_release(tmp_path, rules, line):
    d = run(tmp_path, {"logs/job.err": line + "\n"}, rules)
    assert cause(d)[:2] == ("attributed", "host_oom")
