"""Evidence folders as people hand them in: one node's folder on its own, one job-level file,
and what the reader says it read (with progress on a terminal)."""
import io
import json
import os
import pty
import shutil
import subprocess
import sys

from helpers import CASES
from sattrib.analysis import analyze_folder
from sattrib.cli import _Progress


def _root(d):
    return d.root_cause.model_dump(mode="json") if d.root_cause else None


def test_one_nodes_folder_takes_the_node_from_its_kernel_log(tmp_path):
    # gn02's own folder, under a name that is not the node's: the Xid 79 is kernel evidence
    # on gn02 (its journal's host field), not job output on no node.
    folder = tmp_path / "evidence"
    shutil.copytree(CASES / "xid79_srun_combined_log" / "gn02", folder)
    d, bundle = analyze_folder(folder)
    root = _root(d)
    assert root["category"] == "gpu_hardware" and root["node"] == "gn02"
    assert root["trust"] == "kernel"
    assert bundle.node_dirs == ["gn02"]
    assert any("one node's folder" in n and "kernel log" in n for n in bundle.notes)


def test_one_nodes_folder_without_a_host_in_it_is_named_by_the_folder(tmp_path):
    folder = tmp_path / "hx2"
    folder.mkdir()
    shutil.copy(CASES / "xid48_ecc_nvidia_smi_xml" / "hx2" / "nvidia-smi.xml", folder)
    (folder / "dmesg.txt").write_text("[  12.000000] NVRM: loading NVIDIA UNIX x86_64 Kernel "
                                      "Module  550.54.15\n")
    _, bundle = analyze_folder(folder)
    assert bundle.node_dirs == ["hx2"]
    assert {doc.node for doc in bundle.documents} == {"hx2"}
    assert any("the folder's name" in n for n in bundle.notes)


def test_job_output_alone_stays_job_output(tmp_path):
    # A folder holding only slurm-<id>.out is the job's output: nothing in it is a node's own
    # record, and the job id comes from its name.
    folder = tmp_path / "evidence"
    folder.mkdir()
    shutil.copy(CASES / "xid79_srun_combined_log" / "logs" / "slurm-7001.out", folder)
    d, bundle = analyze_folder(folder)
    assert bundle.node_dirs == [] and {doc.node for doc in bundle.documents} == {None}
    assert {doc.source.value for doc in bundle.documents} == {"stderr"}
    assert d.job_id == "7001"
    assert not any("one node's folder" in n for n in bundle.notes)


def test_text_output_says_what_was_read(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sattrib", "analyze",
                          str(CASES / "xid48_ecc_nvidia_smi_xml")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    last = out.rstrip("\n").split("\n")[-1]
    assert last.startswith("Read 8 files (") and "1 nvidia-smi" in last and "2 kernel log" in last
    assert "4 job output" in last and "with lines the rules recognise" in last
    js = subprocess.run([sys.executable, "-m", "sattrib", "analyze", "--json",
                         str(CASES / "xid48_ecc_nvidia_smi_xml")],
                        capture_output=True, text=True, timeout=120, check=True)
    json.loads(js.stdout)                       # piped: the JSON only, and no progress
    assert js.stderr == ""


def test_progress_and_summary_go_to_a_terminal_only():
    # stderr is a terminal: the reading summary is written there, stdout stays JSON.
    primary, secondary = pty.openpty()
    p = subprocess.run([sys.executable, "-m", "sattrib", "analyze", "--json",
                        str(CASES / "xid48_ecc_nvidia_smi_xml")],
                       stdout=subprocess.PIPE, stderr=secondary, timeout=120)
    os.close(secondary)
    err = os.read(primary, 65536).decode()
    os.close(primary)
    json.loads(p.stdout)
    assert err.startswith("Read 8 files (")


def test_progress_line_is_redrawn_and_erased(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    p = _Progress(after=0)
    p(1, 4, 2_000_000, 8_000_000)
    p(2, 4, 4_000_000, 8_000_000)        # within a quarter second: not redrawn
    p.last = 0
    p(4, 4, 8_000_000, 8_000_000)
    p.clear()
    assert buf.getvalue() == ("\r\x1b[Ksattrib: read 1/4 files, 2/8 MB"
                              "\r\x1b[Ksattrib: read 4/4 files, 8/8 MB\r\x1b[K")
    quiet = _Progress(after=60)           # a short analysis shows nothing at all
    quiet(1, 1, 1, 1)
    quiet.clear()
    assert buf.getvalue().endswith("8/8 MB\r\x1b[K")


def test_a_kernel_log_of_messages_alone_is_the_kernel_s(tmp_path):
    # `journalctl -k -o cat` and `dmesg -t` print the message alone; in a file named as a kernel
    # log that is the kernel's record (contract section 1). A line another program logged keeps
    # its identifier and stays system output.
    for name, text in (("journal.log", "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, name=<unknown>, "
                                       "GPU has fallen off the bus.\n"),
                       ("kern.log", "Mar 27 17:40:36 kernel: NVRM: Xid (PCI:0000:3b:00): 79, "
                                    "pid=0, name=<unknown>, GPU has fallen off the bus.\n")):
        folder = tmp_path / name / "job"
        (folder / "gn07").mkdir(parents=True)
        (folder / "gn07" / name).write_text(text)
        d, _ = analyze_folder(folder)
        root = _root(d)
        assert (root["category"], root["node"], root["trust"]) == ("gpu_hardware", "gn07",
                                                                  "kernel"), name
    folder = tmp_path / "logger" / "job"
    (folder / "gn07").mkdir(parents=True)
    (folder / "gn07" / "journal.log").write_text(
        "Mar 27 17:40:36 gn07 myjob[4242]: NVRM: Xid (PCI:0000:3b:00): 79, pid=0, "
        "name=<unknown>, GPU has fallen off the bus.\n")
    d, _ = analyze_folder(folder)
    assert d.root_cause is None
