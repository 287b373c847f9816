"""Kernel records quote names that users choose: a task's name, the file a program ran from, a
path. Read from where the printer's own words are (engine/kmsg.py), they never become GPU,
NVLink, network, PCIe or storage evidence, through a real journal (journalctl on a journal file
that systemd-journal-remote wrote) and in every text shape a kernel log comes in; and a GPU that
the kernel says fell off the bus, while nvidia-smi answers for it, is not drained on that alone."""
import time

import pytest

from helpers import ROOT, folder
from integration.journal import JournalEntry, journal_remote_binary, write_journal
from sattrib.analysis import analyze_folder
from sattrib.collectors.kernel_log import kernel_journal
from sattrib.engine.taxonomy import FAMILY

# A program mapped from a file named like the driver's Xid line: the kernel's segfault report
# names the file (the task here is called `kernel`, so even its first word looks right).
SEGV = ("kernel[29915]: segfault at 0 ip 00007ff6e9824000 sp 00007ffd5e2a1b80 error 4 in "
        "NVRM: Xid (PCI:0000:9d:00): 79, pid=1, name=x, GPU has fallen off the bus."
        "[0,7ff6e9824000+1000] likely on CPU 1 (core 1, socket 0)")
XID79 = "NVRM: Xid (PCI:0000:9d:00): 79, pid=1, name=x, GPU has fallen off the bus."
RANK = ('Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
        "RuntimeError: my own bug\n")
T0 = 1773050400                     # 2026-03-09T10:00:00Z
MACHINE = {"gpu", "nvlink", "network", "storage"}

# The shapes of CONTRACT.md section 1 a kernel log comes in, for one message.
SHAPES = {
    "journalctl": "Mar 09 10:00:00 node-02 kernel: {}",
    "journalctl -o short-iso": "2026-03-09T10:00:00+0000 node-02 kernel: {}",
    "journalctl -o short-precise": "Mar 09 10:00:00.123456 node-02 kernel: {}",
    "kern.log": "Mar  9 10:00:00 node-02 kernel: [ 8812.334455] {}",
    "dmesg": "[ 8812.334455] {}",
    "dmesg -T": "[Mon Mar  9 10:00:00 2026] {}",
    "dmesg -H": "[Mar09 10:00] {}",
    "dmesg -H, a later line": "[  +0.000844] {}",
    "dmesg -x": "kern  :err   : [ 8812.334455] {}",
    "/dev/kmsg": "3,1234,8812334455,-;{}",
    "Talos": "192.0.2.10: kern:     err: [2026-03-09T10:00:00.458998481Z]: {}",
    "pasted": "kernel: {}",
    "pasted with its host": "node-02 kernel: {}",
    "syslog stamped dmesg-style": "[Mon Mar  9 10:00:00 2026] node-02 kernel: {}",
    "the message alone": "{}",
}

# Kernel records that quote a task's or a file's name, each naming a driver's words in it.
QUOTING = {
    "trap, file": "traps: python[4821] general protection fault ip:7f3a2c1d4e10 "
                  "sp:7ffd5e2a1b80 error:0 in NVRM: Xid (PCI:0000:9d:00): 48, pid=1, name=x, "
                  "DBE (Double Bit Error) ECC Error[7f3a00000000+2c000]",
    "trap, AER file": "traps: python[4821] trap invalid opcode ip:7f3a2c1d4e10 sp:7ffd5e2a1b80 "
                      "error:0 in pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error "
                      "received: id=0100[7f3a00000000+2c000]",
    "arm64 fault, SXid file": "python[4821]: unhandled exception: EL0 Data Abort, ESR "
                              "0x0000000092000046, Oops - Translation fault in nvidia-nvswitch0:"
                              " SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault "
                              "Up[ffff8a000000+1000]",
    "segfault, task named like mlx5": "mlx5_core 0 [4821]: segfault at 0 ip 00007f3a2c1d4e10 sp "
                                      "00007ffd5e2a1b80 error 4 in Fatal error 1 detected"
                                      "[7f3a2c000000+1000]",
    "fatal signal, task named like a link": "e: Link is Down/4821: potentially unexpected fatal "
                                            "signal 11.",
    "OOM, task named like NVRM": "NVRM: GPU 0000 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL),"
                                 " order=0, oom_score_adj=0",
    "OOM, cgroup path": "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=step_0,"
                        "mems_allowed=0-1,oom_memcg=/slurm/uid_1000/job_4242,task_memcg=/slurm/"
                        "uid_1000/job_4242/step_0/mlx5_core 0000:5e:00.0: Fatal error 1 detected,"
                        "task=python,pid=4821,uid=1000",
    "OOM kill, task named like AER": "Out of memory: Killed process 4821 (AER: can't reco) "
                                     "total-vm:81234560kB, anon-rss:60123456kB, file-rss:0kB, "
                                     "shmem-rss:0kB, UID:1000 pgtables:120000kB oom_score_adj:0",
    "OOM reaper, task named like NVRM": "oom_reaper: reaped process 4821 (NVRM: Xid (PC), now "
                                        "anon-rss:0kB, file-rss:0kB, shmem-rss:0kB",
    "hung task": "INFO: task NVRM: Xid (PC:4821 blocked for more than 120 seconds.",
    "hung task's state": "task:NVRM: Xid (PC   state:D stack:0     pid:4821  ppid:1      "
                         "flags:0x00004002",
    "audit, exe path": 'audit: type=1326 audit(1773050400.123:42): auid=1000 uid=1000 gid=1000 '
                       'ses=1 pid=4821 comm="python" exe="/home/u/NVRM: Xid (PCI:0000:9d:00): '
                       '79, pid=1, name=x, GPU has fallen off the bus." sig=31 arch=c000003e '
                       'syscall=1 compat=0 ip=0x7f code=0x0',
    "exec, path": "process 'x' launched '/tmp/nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, "
                  "Fatal, Link 30 LTSSM Fault Up' with NULL argv: empty string added",
}


def machine_evidence(d) -> list:
    """Evidence lines the diagnosis takes as a fault of the machine (GPU, link, port, disk)."""
    return [(e.rule, e.text) for e in d.evidence
            if e.category is not None and FAMILY[e.category] in MACHINE]


def kernel_journal_of(tmp_path, messages: list) -> tuple[str, str]:
    """The node Epilog's kernel journal (its own journalctl call) of a real journal file that
    holds `messages` as records the kernel wrote on node-02."""
    if journal_remote_binary() is None:
        pytest.fail("systemd-journal-remote missing: run tests/integration/setup-system.sh",
                    pytrace=False)
    d = tmp_path / "journal"
    write_journal(d / "system.journal", [
        JournalEntry(m, (T0 + i) * 10**6, hostname="node-02") for i, m in enumerate(messages)])
    return kernel_journal(T0 - 600, T0 + 60, time.monotonic() + 30, str(d))


def test_a_segfault_naming_an_xid_through_the_real_journal_is_the_jobs_own(tmp_path, rules):
    name, text = kernel_journal_of(tmp_path, [SEGV])
    assert name == "journal.jsonl" and '"_TRANSPORT":"kernel"' in text.replace(" ", "")
    d, _ = analyze_folder(folder(tmp_path / "case", {
        f"node-02/{name}": text, "node-02/rank-0.stderr": RANK}), rules=rules)
    assert machine_evidence(d) == []
    assert (d.outcome.value, d.root_cause.category.value) == ("attributed", "application_error")
    assert d.root_cause.action_code.value == "fix_application"


def test_the_kernels_own_xid_through_the_real_journal_still_drains(tmp_path, rules):
    name, text = kernel_journal_of(tmp_path, [XID79])
    d, _ = analyze_folder(folder(tmp_path / "case", {
        f"node-02/{name}": text, "node-02/rank-0.stderr": RANK}), rules=rules)
    assert (d.root_cause.category.value, d.root_cause.gpu) == ("gpu_hardware", "0000:9d:00.0")
    assert d.root_cause.action_code.value == "reboot_node" and d.root_cause.trust.value == "kernel"


@pytest.mark.parametrize("shape", SHAPES)
def test_a_segfault_naming_an_xid_in_any_kernel_log_shape(tmp_path, rules, shape):
    d, _ = analyze_folder(folder(tmp_path, {
        "node-02/journal.log": SHAPES[shape].format(SEGV) + "\n",
        "node-02/rank-0.stderr": RANK}), rules=rules)
    assert machine_evidence(d) == []
    assert d.root_cause.category.value == "application_error"


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "the message alone"])
def test_the_kernels_own_xid_in_the_same_shapes(tmp_path, rules, shape):
    """The shapes above are read as kernel records (the message alone is not, today)."""
    d, _ = analyze_folder(folder(tmp_path, {
        "node-02/journal.log": SHAPES[shape].format(XID79) + "\n"}), rules=rules)
    assert (d.root_cause.category.value, d.root_cause.gpu) == ("gpu_hardware", "0000:9d:00.0")


@pytest.mark.parametrize("record", QUOTING)
def test_records_that_quote_names_are_no_machine_fault(tmp_path, rules, record):
    d, _ = analyze_folder(folder(tmp_path, {
        "node-02/journal.log": SHAPES["journalctl"].format(QUOTING[record]) + "\n"}), rules=rules)
    assert machine_evidence(d) == []
    assert d.root_cause is None or FAMILY[d.root_cause.category] not in MACHINE


def test_a_driver_line_after_its_device_is_still_read(tmp_path, rules):
    """dev_printk's `<driver> <address>: ` comes first; the rules read on after it."""
    d, _ = analyze_folder(folder(tmp_path, {"node-02/journal.log": SHAPES["journalctl"].format(
        "nvidia 0000:3b:00.0: AER: can't recover (no error_detected callback)") + "\n"}),
        rules=rules)
    assert (d.root_cause.category.value, d.root_cause.node) == ("pcie", "node-02")


# -- a second source on the node -----------------------------------------------------------------
HEALTHY = (ROOT / "tests" / "data" / "samples" /
           "nvidia-smi-q.h100-8gpu.535.161.08.healthy.txt").read_text()
LOST = ("Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the "
        "system to recover this GPU\n")
XID79_3B = SHAPES["journalctl"].format(
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=<unknown>, GPU has fallen off the bus.") + "\n"


@pytest.mark.parametrize("smi, contradicted", [
    ({"node-02/nvidia-smi.txt": HEALTHY}, True),              # answers for 0000:3b:00.0
    ({"node-02/nvidia-smi.txt": HEALTHY + LOST}, False),      # ... and says it is lost
    ({"node-02/nvidia-smi.txt": HEALTHY.replace("00000000:3B:00.0", "00000000:3C:00.0")}, False),
    ({}, False),                                              # no second source
], ids=["answers", "answers-and-lost", "other-gpus-only", "no-nvidia-smi"])
def test_a_lost_gpu_that_nvidia_smi_answers_for_is_contradicted(tmp_path, rules, smi,
                                                                 contradicted):
    d, _ = analyze_folder(folder(tmp_path, {"node-02/journal.log": XID79_3B, **smi}),
                          rules=rules)
    root = d.root_cause
    assert (root.category.value, root.gpu) == ("gpu_hardware", "0000:3b:00.0")
    assert bool(root.contradicted_by) is contradicted
    if contradicted:
        assert "nvidia-smi on node-02 answers for GPU 0000:3b:00.0" in root.contradicted_by
        assert "node-02/nvidia-smi.txt:2" in root.contradicted_by
