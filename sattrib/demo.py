"""The built-in demo workload: a synthetic 4-node training job that failed on an NVLink fault.

`write_demo(dir)` writes it as an evidence folder (the layout `sattrib analyze` reads). Every rank on three nodes
shows a different NCCL failure (a closed socket, an IB retry-exceeded completion naming node-02's
address, a watchdog timeout); node-02's own ranks report an uncorrectable NVLink error; the only
hardware event is in node-02's kernel log: Xid 149 NETIR_LINK_EVT, link-down reason 10 (link
signal integrity), with Xid 154, a sympathetic Xid 145 on another GPU and Xid 45 teardown.
All names, addresses and serials are made up.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Optional

JOB_ID = "1001"
NODES = ["node-01", "node-02", "node-03", "node-04"]
RANKS_PER_NODE = 4
DAY = "2026-11-02"
GPUS = ["0000:1b:00", "0000:43:00", "0000:9d:00", "0000:c3:00"]
UUIDS = ["GPU-2f6c1e0a-5d3b-4c8e-9a71-0c4f5e6d7a81", "GPU-8a3d5b21-7e4f-4a0c-b9d2-1e6f3a5c7b92",
         "GPU-c41e7f93-2a6d-4b8e-8f05-3d7a9c1e5b03", "GPU-e5b2a804-9c1f-4d7a-a316-5f8b2d4c6e14"]
IPS = {n: f"10.0.2.{11 + i}" for i, n in enumerate(NODES)}
SEQ = 418733
END = datetime.fromisoformat(f"{DAY}T10:24:12+00:00")     # the job's end, as recorded


class _Clock:
    """The demo's times of day, moved as a whole so that the job ends at `end` (sattrib demo:
    now, so that `sattrib list` right after it shows the job); unmoved by default."""

    def __init__(self, end: Optional[datetime] = None):
        self.shift = (end.replace(microsecond=0) - END) if end else timedelta(0)

    def at(self, hms: str) -> datetime:
        return datetime.fromisoformat(f"{DAY}T{hms}+00:00") + self.shift

    def ts(self, hms: str, frac: str = "") -> str:
        return self.at(hms).strftime("%Y-%m-%dT%H:%M:%S") + frac + "+0000"

    def log(self, hms: str) -> str:
        """Python logging's `YYYY-MM-DD HH:MM:SS`."""
        return self.at(hms).strftime("%Y-%m-%d %H:%M:%S")

    def glog(self, hms: str) -> str:
        """glog's `E1102 10:14:08`, less its severity letter."""
        return self.at(hms).strftime("%m%d %H:%M:%S")

    def slurm(self, hms: str) -> str:
        return self.at(hms).strftime("%Y-%m-%dT%H:%M:%S")


def _journal(node: str, c: _Clock) -> list[str]:
    lines = [
        f"{c.ts('07:58:51')} {node} kernel: perf: interrupt took too long (2504 > 2500), "
        "lowering kernel.perf_event_max_sample_rate to 79750",
        f"{c.ts('08:00:02')} {node} slurmd[2211]: slurmd: launch task StepId={JOB_ID}.0 request "
        "from UID:41207 GID:5100 HOST:10.0.1.5 PORT:40112",
        f"{c.ts('09:31:40')} {node} kernel: hrtimer: interrupt took 2249800 ns",
    ]
    if node == "node-02":
        bad, other = 2, 0
        lines += [
            f"{c.ts('10:14:07')} {node} kernel: NVRM: GPU at PCI:{GPUS[bad]}: {UUIDS[bad]}",
            f"{c.ts('10:14:07')} {node} kernel: NVRM: GPU Board Serial Number: 1650000000032",
            f"{c.ts('10:14:07')} {node} kernel: NVRM: Xid (PCI:{GPUS[bad]}): 149, "
            "pid='<unknown>', name=<unknown>, NETIR_LINK_EVT  Fatal   XC0 i0 Link 05 "
            "(0x00a001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
            f"{c.ts('10:14:07')} {node} kernel: NVRM: Xid (PCI:{GPUS[bad]}): 154, "
            "pid='<unknown>', name=<unknown>, GPU recovery action changed from 0x0 (None) to "
            "0x1 (GPU Reset Required)",
            f"{c.ts('10:14:07')} {node} kernel: NVRM: GPU at PCI:{GPUS[other]}: {UUIDS[other]}",
            f"{c.ts('10:14:07')} {node} kernel: NVRM: Xid (PCI:{GPUS[other]}): 145, pid=3391485, "
            "name=pt_main_thread, RLW_REMAP Nonfatal XC1 i0 Link 03 (0x00000082 0x00000004 "
            "0x00000000 0x00000000 0x00000000 0x00000000)",
        ]
        lines += [f"{c.ts('10:14:08')} {node} kernel: NVRM: Xid (PCI:{g}): 45, pid={3391485 + i}, "
                  f"name=pt_main_thread, Ch 0000000{8 + i % 2}" for i, g in enumerate(GPUS)]
    lines.append(f"{c.ts('10:24:09')} {node} kernel: nvidia-peermem nv_get_p2p_free_callback:127 "
                 "ERROR detected invalid context, skipping further processing")
    return lines


def _rank_out(node: str, rank: int, c: _Clock) -> tuple[list[str], list[str]]:
    local = rank % RANKS_PER_NODE
    pid = 2580000 + rank * 7
    pre = f"{node}:{pid}:{pid + 700} [{local}]"
    out = [f"{pre} NCCL INFO Bootstrap : Using ib0:{IPS[node]}<0>",
           f"{pre} NCCL INFO NCCL version 2.21.5+cuda12.4",
           f"{pre} NCCL INFO ncclCommInitRank comm 0x55d0c3a0{rank:04x} rank {rank} nranks "
           f"{len(NODES) * RANKS_PER_NODE} cudaDev {local} nvmlDev {local} busId "
           f"{GPUS[local][5:7]}000 commId 0x6d2e9b41c3f05a17 - Init COMPLETE"]
    err: list[str] = []
    if rank == 0:
        for i, hms in enumerate(("09:12:30", "09:44:51", "10:13:40")):
            out.append(f"{c.log(hms)},{100 + i * 37:03d} INFO [train.py:214] step "
                       f"{41000 + i * 200} | loss {1.53 - i * 0.01:.4f} | lr 2.1e-04 | "
                       "412.1 TFLOP/s/GPU")

    def glog(hms: str) -> str:
        return f"[rank{rank}]:[E{c.glog(hms)}"
    if node == "node-02":
        err += [f"{glog('10:14:08')}.{rank:02d}4118419 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID "
                f"0(default_pg) Rank {rank}] Process group watchdog thread terminated with "
                "exception: CUDA error: uncorrectable NVLink error detected during the execution",
                "terminate called after throwing an instance of 'c10::DistBackendError'"]
    elif node == "node-01":
        out.append(f"{pre} misc/socket.cc:64 NCCL WARN socketProgress: Connection closed by "
                   f"remote peer node-02.ib.cluster.internal<{40460 + rank}>")
        err += [f"{glog('10:14:09')}.{rank:02d}2118767 ProcessGroupNCCL.cpp:2101] [PG ID 0 PG GUID "
                f"0(default_pg) Rank {rank}] Exception (either an error or timeout) detected by "
                f"watchdog at work: {SEQ}, last enqueued NCCL work: {SEQ}, last completed NCCL "
                f"work: {SEQ - 1}.",
                f"{glog('10:14:09')}.{rank:02d}2118990 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID "
                f"0(default_pg) Rank {rank}] Process group watchdog thread terminated with "
                "exception: NCCL error: remote process exited or there was a network error, "
                "NCCL version 2.21.5"]
    elif node == "node-03":
        out.append(f"{pre} transport/net_ib.cc:2118 NCCL WARN NET/IB: Got completion from peer "
                   f"{IPS['node-02']}<{53000 + rank}> with status=12 opcode=0 len=0 vendor err "
                   "129 (Send) hca mlx5_0")
        err += [f"{glog('10:14:42')}.{rank:02d}1183022 ProcessGroupNCCL.cpp:1896] [PG ID 0 PG GUID "
                f"0(default_pg) Rank {rank}] Process group watchdog thread terminated with "
                "exception: NCCL error: remote process exited or there was a network error, "
                "NCCL version 2.21.5"]
    else:
        err += [f"{glog('10:24:07')}.{rank:02d}4719544 ProcessGroupNCCL.cpp:682] [Rank {rank}] "
                f"Watchdog caught collective operation timeout: WorkNCCL(SeqNum={SEQ}, "
                "OpType=ALLREDUCE, NumelIn=139460608, NumelOut=139460608, Timeout(ms)=600000) "
                "ran for 600133 milliseconds before timing out.",
                f"{glog('10:24:07')}.{rank:02d}4720101 ProcessGroupNCCL.cpp:630] [Rank {rank}] To "
                "avoid data inconsistency, we are taking the entire process down."]
    return out, err


def _job_txt(c: _Clock) -> str:
    n = len(NODES) * RANKS_PER_NODE
    return f"""JobId={JOB_ID} JobName=llm-pretrain-demo
   UserId=demo(41207) GroupId=llm(5100) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=134:0
   RunTime=02:24:12 TimeLimit=2-00:00:00 TimeMin=N/A
   SubmitTime={c.slurm("07:59:40")} EligibleTime={c.slurm("07:59:40")}
   StartTime={c.slurm("08:00:00")} EndTime={c.slurm("10:24:12")} Deadline=N/A
   Partition=gpu AllocNode:Sid=login01:4242
   NodeList=node-[01-04]
   BatchHost=node-01
   NumNodes=4 NumCPUs=128 NumTasks={n} CPUs/Task=8 ReqB:S:C:T=0:0:*:*
   NtasksPerN:B:S:C={RANKS_PER_NODE}:0:*:* CoreSpec=*
   WorkDir=/home/demo/llm
   StdErr=/home/demo/llm/slurm-{JOB_ID}.out
   StdOut=/home/demo/llm/slurm-{JOB_ID}.out
"""


def _nvlink_status() -> str:
    out = []
    for i, u in enumerate(UUIDS):
        out.append(f"GPU {i}: NVIDIA B200 (UUID: {u})")
        for link in range(18):
            state = "<inactive>" if (i == 2 and link == 5) else "50 GB/s"
            out.append(f"\t Link {link}: {state}")
    return "\n".join(out) + "\n"


def write_demo(root: Path, end: Optional[datetime] = None) -> Path:
    """The demo job's evidence folder; `end`: when the job ended (default: as recorded)."""
    c = _Clock(end)
    root = Path(root)
    (root / "slurm").mkdir(parents=True, exist_ok=True)
    (root / "slurm" / "job.txt").write_text(_job_txt(c))
    rank = 0
    for node in NODES:
        d = root / node
        d.mkdir(exist_ok=True)
        (d / "journal.log").write_text("\n".join(_journal(node, c)) + "\n")
        for _ in range(RANKS_PER_NODE):
            out, err = _rank_out(node, rank, c)
            (d / f"rank-{rank}.stdout").write_text("\n".join(out) + "\n")
            (d / f"rank-{rank}.stderr").write_text("\n".join(err) + "\n")
            rank += 1
    (root / "node-02" / "nvidia-smi-nvlink.txt").write_text(_nvlink_status())
    return root
