#!/usr/bin/env python3
"""Generate a large synthetic failed GPU job as an evidence folder (the layout `sattrib analyze` reads).

    python bench/make_job.py --nodes 256 --ranks-per-node 8 --mb-per-rank 1.5 --out /tmp/job256

Layout written:
    OUT/slurm/job.txt                 scontrol show job text (JobState=FAILED)
    OUT/logs/slurm-<jobid>.out        job-level srun output (small)
    OUT/<node>/journal.log            ISO-prefixed kernel log, benign noise
    OUT/<node>/rank-<N>.stdout        mostly NCCL INFO lines (host:pid:tid [dev] NCCL INFO ...)
    OUT/<node>/rank-<N>.stderr        python logging progress, warnings, tqdm \\r lines,
                                      a few non-UTF-8 bytes, and at the end the PyTorch
                                      watchdog timeout block
    OUT/_planted.json                 what was planted (ignored by sattrib: leading "_")

One real failure is buried: on one node (chosen by the seed) journal.log has an Xid 79
("GPU has fallen off the bus") and the rank on that GPU ends with `CUDA error: unknown error`
instead of the watchdog timeout; every other rank times out 600 s later. A couple of ranks that
talk to the lost GPU over IB also print an NCCL IB completion error (a symptom, not a cause).

Deterministic for a given seed and options. Files are written streaming from pre-built blocks
(only timestamps, steps and a few ids vary), so memory stays small whatever the size.
MB here means 10^6 bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from datetime import datetime, timezone

MB = 1_000_000
DAY0 = datetime(2026, 3, 9, tzinfo=timezone.utc)
DAY0_EPOCH = int(DAY0.timestamp())
JOB_START = 6 * 3600                    # seconds after DAY0 (06:00:00Z)
FAIL_AT = 9 * 3600 + 47 * 60 + 13       # 09:47:13Z: Xid 79
WATCHDOG_AT = FAIL_AT + 600             # 09:57:13Z: everybody else's 600 s watchdog fires
JOB_END = 9 * 3600 + 58 * 60 + 30       # 09:58:30Z
# DGX H100 GPU bus ids by local index
BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]

P = b"\x00P\x00"      # placeholder: "host:pid:tid [dev] " prefix
C = b"\x00C\x00"      # placeholder: comm pointer (varies per communicator)
I = b"\x00I\x00"      # placeholder: commId

# ----------------------------------------------------------------------------- helpers


def hms(sec: float) -> str:
    s = int(sec)
    h, r = divmod(s, 3600)
    m, s = divmod(r, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


def iso(sec: float) -> str:
    return f"2026-03-09T{hms(sec)}+0000"


def iso_z(sec: float) -> str:
    return f"2026-03-09T{hms(sec)}"


def node_names(n: int) -> list[str]:
    """Two racks, with a gap in each (a drained node), so NodeList is a real hostlist."""
    half = (n + 1) // 2
    a = [i for i in range(1, half + 2) if i != 7][:half]
    b = [i for i in range(101, 101 + (n - half) + 1) if i != 113][: n - half]
    return [f"gpu-a{i:04d}" for i in a] + [f"gpu-b{i:04d}" for i in b]


def hostlist(names: list[str]) -> str:
    groups: dict[str, list[int]] = {}
    for nm in names:
        groups.setdefault(nm[:-4], []).append(int(nm[-4:]))
    parts = []
    for pre, nums in groups.items():
        nums.sort()
        rngs, s, prev = [], nums[0], nums[0]
        for x in nums[1:] + [None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            rngs.append(f"{s:04d}" if s == prev else f"{s:04d}-{prev:04d}")
            if x is not None:
                s = prev = x
        parts.append(f"{pre}[{','.join(rngs)}]" if len(nums) > 1 else f"{pre}{nums[0]:04d}")
    return ",".join(parts)


def node_ip(i: int) -> str:
    return f"10.40.{8 + i // 200}.{11 + i % 200}"


# ----------------------------------------------------------------------------- blocks (built once)


class Blocks:
    """Pre-built text, shared by all ranks; per-rank parts are filled in by bytes.replace."""

    def __init__(self, rng: random.Random, nranks: int, nnodes: int, rpn: int):
        self.nranks, self.nnodes, self.rpn = nranks, nnodes, rpn
        self.stdout_head = self._stdout_head()
        self.comm_init = self._comm_init(rng)
        self.p2p = [self._p2p(rng, k) for k in range(8)]
        self.train_tails = [self._train_tail(rng) for _ in range(4096)]
        self.tqdm = [self._tqdm(rng, k) for k in range(16)]
        self.warnings = self._warnings()
        self._stderr_cache: dict = {}

    def stderr_body(self, body_target: int) -> list[tuple[bytes, bool]]:
        """The rank stderr body up to body_target bytes, as (segment, has_placeholders)."""
        if body_target in self._stderr_cache:
            return self._stderr_cache[body_target]
        t0, t1 = JOB_START + 95, FAIL_AT - 4
        step = 180_000
        out: list[tuple[bytes, bool]] = [(
            ts_py(JOB_START + 58) + b" INFO [train.py:171] resumed from /scratch/pt70b/ckpt/"
            b"step_180000 (world_size=" + str(self.nranks).encode() + b", rank=\x00R\x00)\n",
            True)]
        n = len(out[0][0])
        seg = 0
        while n < body_target:
            parts = []
            t = t0
            for j in range(48):
                t = t0 + (t1 - t0) * min(1.0, (n + j * 148) / body_target)
                step += 10
                if j == 24:
                    parts.append(ts_py(t) + b" INFO [train.py:230] mem allocated 61.2 GiB "
                                 b"reserved 72.0 GiB peak 68.3 GiB | dataloader wait 0.8 ms\n")
                parts.append(ts_py(t) + b" INFO [train.py:214] step " + str(step).encode()
                             + self.train_tails[(step // 10) & 4095])
            if seg % 4 == 3:
                parts.append(self.tqdm[seg % 16])
            blob = b"".join(parts)
            warn = None
            if seg % 7 == 5:
                warn = self.warnings[seg % len(self.warnings)].replace(b"\x00T\x00", ts_py(t))
            size = len(blob) + (len(warn) if warn else 0)
            if n + size > body_target and seg > 0:
                break
            out.append((blob, False))
            if warn:
                out.append((warn, True))
            n += size
            seg += 1
        self._stderr_cache = {body_target: out}
        return out

    def _stdout_head(self) -> bytes:
        lines = [
            "NCCL INFO Bootstrap : Using ib0:\x00A\x00<0>",
            "NCCL INFO cudaDriverVersion 12080",
            "NCCL INFO NCCL version 2.26.2+cuda12.8",
            "NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
            "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_3:1/IB [2]mlx5_4:1/IB [3]mlx5_5:1/IB "
            "[4]mlx5_6:1/IB [5]mlx5_9:1/IB [6]mlx5_10:1/IB [7]mlx5_11:1/IB [RO]; OOB ib0:\x00A\x00<0>",
            "NCCL INFO Using non-device net plugin version 0",
            "NCCL INFO Using network IB",
        ]
        return b"".join(P + ln.encode() + b"\n" for ln in lines)

    def _comm_init(self, rng: random.Random) -> bytes:
        """One communicator creation, as NCCL_DEBUG=INFO prints it (~12 KB)."""
        n, nn, rpn = self.nranks, self.nnodes, self.rpn
        L = []
        L.append(f"NCCL INFO ncclCommInitRank comm 0x{C.decode()} rank \x00R\x00 nranks {n} "
                 f"cudaDev \x00D\x00 nvmlDev \x00D\x00 busId \x00B\x00000 commId 0x{I.decode()} "
                 "- Init START")
        L.append("NCCL INFO NCCL_CUMEM_ENABLE set by environment to 1.")
        L.append("NCCL INFO Setting affinity for GPU \x00D\x00 to ffffffff,00000000,ffffffff")
        L.append("NCCL INFO NVLS multicast support is available on dev \x00D\x00 (NVLS_NCHANNELS 16)")
        L.append(f"NCCL INFO comm 0x{C.decode()} rank \x00R\x00 nRanks {n} nNodes {nn} "
                 f"localRanks {rpn} localRank \x00D\x00 MNNVL 0")
        L.append("NCCL INFO NVLS Head  0:  " + " ".join(str(i * rpn) for i in range(min(nn, 16))))
        for ch in range(24):
            ring = " ".join(f"{(ch + i) % n:4d}" for i in range(min(n, 16)))
            L.append(f"NCCL INFO Channel {ch:02d}/24 : {ring}")
        L.append("NCCL INFO Trees " + " ".join(f"[{c}] 1/{rpn}/-1->0->-1" for c in range(8)))
        L.append("NCCL INFO P2P Chunksize set to 131072")
        for ch in range(24):
            for peer in range(3):
                kind = rng.choice(["P2P/CUMEM/read", "P2P/CUMEM", "NET/IB/0/GDRDMA"])
                L.append(f"NCCL INFO Channel {ch:02d}/0 : \x00R\x00[\x00D\x00] -> "
                         f"{(peer + 1) % n}[{(peer + 1) % rpn}] via {kind}")
        L.append("NCCL INFO Connected all rings, use ring PXN 0 GDR 1")
        L.append("NCCL INFO Connected all trees")
        L.append(f"NCCL INFO NVLS comm 0x{C.decode()} headRank 0 nHeads {min(nn, 16)} "
                 "buffSize 1048576 memSize 2097152 nvlsPerRankSize 201326592 "
                 "nvlsTotalSize 805306368")
        L.append("NCCL INFO Connected NVLS")
        L.append("NCCL INFO threadThresholds 8/8/64 | 256/8/64 | 512 | 512")
        L.append("NCCL INFO 24 coll channels, 24 collnet channels, 16 nvls channels, "
                 "32 p2p channels, 32 p2p channels per peer")
        L.append("NCCL INFO TUNER/Plugin: Could not find: libnccl-tuner.so. Using internal "
                 "tuner plugin.")
        L.append("NCCL INFO CC Off, workFifoBytes 1048576")
        L.append(f"NCCL INFO ncclCommInitRank comm 0x{C.decode()} rank \x00R\x00 nranks {n} "
                 f"cudaDev \x00D\x00 nvmlDev \x00D\x00 busId \x00B\x00000 commId 0x{I.decode()} "
                 "- Init COMPLETE")
        L.append(f"NCCL INFO Init timings - ncclCommInitRank: rank \x00R\x00 nranks {n} total "
                 "0.91 (kernels 0.17, alloc 0.02, bootstrap 0.51, allgathers 0.04, topo 0.10, "
                 "graphs 0.01, connections 0.05, rest 0.01)")
        return b"".join(P + ln.encode() + b"\n" for ln in L)

    def _p2p(self, rng: random.Random, k: int) -> bytes:
        """Lazily connected send/recv channels during training (~16 KB, no rule literals)."""
        n, rpn = self.nranks, self.rpn
        L: list[str] = []
        size = 0
        while size < 16000:
            ch = rng.randrange(32)
            peer = rng.randrange(n)
            d = rng.choice(["send", "recv"])
            via = rng.choice(["NET/IB/0/GDRDMA/Shared", "NET/IB/3/GDRDMA/Shared",
                              "P2P/CUMEM/read", "NET/IB/5/GDRDMA"])
            L.append(f"NCCL INFO Channel {ch:02d}/1 : \x00R\x00[\x00D\x00] -> "
                     f"{peer}[{peer % rpn}] [{d}] via {via}")
            size += len(L[-1]) + 40
            if rng.random() < 0.05:
                L.append("NCCL INFO Connected to proxy localRank \x00D\x00 -> connection "
                         f"0x7f{rng.getrandbits(36):09x}")
        return b"".join(P + ln.encode() + b"\n" for ln in L)

    @staticmethod
    def _train_tail(rng: random.Random) -> bytes:
        return (f" | loss {rng.uniform(1.45, 1.65):.4f} | lr {rng.uniform(2.05, 2.15):.3f}e-04"
                f" | grad_norm {rng.uniform(0.5, 1.2):.3f} | {rng.uniform(400, 420):.1f} "
                f"TFLOP/s/GPU | {rng.uniform(5.8, 6.0):.2f}M tok/s\n").encode()

    @staticmethod
    def _tqdm(rng: random.Random, k: int) -> bytes:
        """A tqdm progress bar redrawn with carriage returns, all on one 'line' (~4 KB)."""
        total = 2000
        parts = []
        for i in range(0, total + 1, 50):
            pct = i * 100 // total
            fill = "\u2588" * (pct // 10) + " " * (10 - pct // 10)
            rate = rng.uniform(9.5, 10.2)
            parts.append(f"eval shard {k:02d}: {pct:3d}%|{fill}| {i}/{total} "
                         f"[{i // 600:02d}:{(i // 10) % 60:02d}<03:{59 - (i // 40) % 60:02d}, "
                         f"{rate:.2f}it/s]")
        return ("\r" + "\r".join(parts) + "\n").encode()

    @staticmethod
    def _warnings() -> list[bytes]:
        return [
            b"/usr/local/lib/python3.10/dist-packages/torch/utils/checkpoint.py:464: UserWarning:"
            b" torch.utils.checkpoint: the use_reentrant parameter should be passed explicitly."
            b" In version 2.5 we will raise an exception if use_reentrant is not passed.\n"
            b"  return fn(*args, **kwargs)\n",
            b"/usr/local/lib/python3.10/dist-packages/torch/distributed/fsdp/_state_dict_utils.py"
            b":773: UserWarning: When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict"
            b" will be returned.\n  warnings.warn(\n",
            b"\x00T\x00 WARNING [data.py:131] skipping malformed sample in /lustre/corpus/"
            b"caf\xe9-2019/shard-00421.jsonl: b'\xff\xfe\x00\x81bad'\n",
            b"[rank\x00R\x00]:[W309 06:01:12.512345678 ProcessGroupNCCL.cpp:4115] Warning: "
            b"TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is "
            b"thus deprecated. (function operator())\n",
            b"/usr/local/lib/python3.10/dist-packages/transformer_engine/pytorch/attention.py:"
            b"5012: FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated. Please use "
            b"`torch.amp.autocast('cuda', args...)` instead.\n  with torch.cuda.amp.autocast("
            b"enabled=False):\n",
        ]


# ----------------------------------------------------------------------------- per-rank files


def ts_py(sec: float) -> bytes:
    ms = int((sec - int(sec)) * 1000)
    return f"2026-03-09 {hms(sec)},{ms:03d}".encode()


def glog_ts(sec: float, nanos: int) -> str:
    return f"0309 {hms(sec)}.{nanos:09d}"


def watchdog_tail(r: int, seq: int, numel: int, rng: random.Random) -> bytes:
    t = glog_ts(WATCHDOG_AT, 4_000_000 + rng.randrange(90_000_000))
    ran = 600_000 + rng.randrange(40, 140)
    wd = (f"[Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum={seq}, "
          f"OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=600000) ran for "
          f"{ran} milliseconds before timing out.")
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    frames = (
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f11c16cda66 in "
        "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)\n"
        "frame #1: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::"
        "duration<long, std::ratio<1l, 1000l> > >) + 0x1d2 (0x7fc4ae2df987 in /usr/local/lib/"
        "python3.10/dist-packages/torch/lib/libtorch_cuda.so)\n"
        "frame #2: c10d::ProcessGroupNCCL::watchdogHandler() + 0x233 (0x7fc4aebbaf25 in "
        "/usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)\n"
        "frame #3: c10d::ProcessGroupNCCL::ncclCommWatchdog() + 0x14d (0x7fc4add1d603 in "
        "/usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)\n"
        "frame #4: <unknown function> + 0xdc253 (0x7f859d058253 in /lib/x86_64-linux-gnu/"
        "libstdc++.so.6)\n"
        "frame #5: <unknown function> + 0x94ac3 (0x7fde032f2ac3 in /lib/x86_64-linux-gnu/"
        "libc.so.6)\n"
    )
    s = (
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:682] {wd}\n"
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:2101] {pg} Exception (either an error or timeout) "
        f"detected by watchdog at work: {seq}, last enqueued NCCL work: {seq}, last completed "
        f"NCCL work: {seq - 1}.\n"
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:2150] {pg} Timeout at NCCL work: {seq}, last "
        f"enqueued NCCL work: {seq}, last completed NCCL work: {seq - 1}.\n"
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:696] [Rank {r}] Some NCCL operations have failed "
        "or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations "
        "might run on corrupted/incomplete data.\n"
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:702] [Rank {r}] To avoid data inconsistency, we "
        "are taking the entire process down.\n"
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:1896] {pg} Process group watchdog thread "
        f"terminated with exception: {wd}\n"
        "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:685 (most recent call first):\n" + frames + "\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  {pg} Process group watchdog thread terminated with exception: {wd}\n"
        "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:685 (most recent call first):\n" + frames
    )
    return s.encode()


def cuda_error_tail(r: int) -> bytes:
    t = glog_ts(FAIL_AT + 2, 134_902_082)
    pg = f"[PG ID 0 PG GUID 0(default_pg) Rank {r}]"
    msg = (
        "CUDA error: unknown error\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the "
        "stacktrace below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n\n"
    )
    frames = (
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7fc0c0e5f17a in "
        "/usr/local/lib/python3.10/dist-packages/torch/lib/libc10.so)\n"
        "frame #1: c10::detail::torchCheckFail(char const*, char const*, unsigned int, "
        "std::string const&) + 0x64 (0x7fc0c1017312 in /usr/local/lib/python3.10/dist-packages/"
        "torch/lib/libc10.so)\n"
        "frame #2: c10::cuda::c10_cuda_check_implementation(int, char const*, char const*, int, "
        "bool) + 0x118 (0x7fceda2ab72c in /usr/local/lib/python3.10/dist-packages/torch/lib/"
        "libc10_cuda.so)\n"
        "frame #3: c10d::ProcessGroupNCCL::WorkNCCL::finishedGPUExecutionInternal() const + 0x56 "
        "(0x7f3c932b0445 in /usr/local/lib/python3.10/dist-packages/torch/lib/libtorch_cuda.so)\n"
    )
    s = (
        f"[rank{r}]:[E{t} ProcessGroupNCCL.cpp:1895] {pg} Process group watchdog thread "
        f"terminated with exception: " + msg +
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 "
        "(most recent call first):\n" + frames + "\n"
        "terminate called after throwing an instance of 'c10::DistBackendError'\n"
        f"  what():  {pg} Process group watchdog thread terminated with exception: " + msg +
        "Exception raised from c10_cuda_check_implementation at ../c10/cuda/CUDAException.cpp:43 "
        "(most recent call first):\n" + frames
    )
    return s.encode()


def write_rank(bk: Blocks, d: str, node: str, ni: int, local: int, rank: int, target: int,
               seed: int, plant: dict) -> tuple[int, int]:
    rng = random.Random(seed * 1_000_003 + rank)
    pid = 1_500_000 + rng.randrange(2_000_000)
    prefix = f"{node}:{pid}:{pid + 600 + rng.randrange(400)} [{local}] ".encode()
    rank_b = str(rank).encode()

    def fill(b: bytes) -> bytes:
        return (b.replace(P, prefix).replace(b"\x00R\x00", rank_b)
                .replace(b"\x00D\x00", str(local).encode())
                .replace(b"\x00B\x00", BUS[local % 8].encode())
                .replace(b"\x00A\x00", node_ip(ni).encode()))

    culprit = rank == plant["rank"]
    out_target = int(target * 0.7)
    err_target = target - out_target

    # ---- stdout: NCCL INFO (communicator inits early, then lazy p2p connections)
    comm_init = fill(bk.comm_init)
    p2p = [fill(x) for x in bk.p2p[(rank % 4):(rank % 4) + 4]]
    n_out = 0
    with open(os.path.join(d, f"rank-{rank}.stdout"), "wb", buffering=1 << 20) as f:
        n_out += f.write(fill(bk.stdout_head))
        k = 0
        while n_out < out_target - 20_000:
            # Many communicators up front (DP/TP/PP groups), the odd one later (new subgroups).
            if k < 6 or rng.random() < 0.15:
                blk = (comm_init.replace(C, f"{0x55a21d000000 + rng.getrandbits(24):x}".encode())
                       .replace(I, f"{rng.getrandbits(64):016x}".encode()))
            else:
                blk = p2p[k % 4]
            n_out += f.write(blk)
            k += 1
        if rank in plant["ib_symptom_ranks"]:
            n_out += f.write(
                prefix + f"transport/net_ib.cc:2118 NCCL WARN NET/IB: Got completion from peer "
                f"{node_ip(plant['node_index'])}<53003> with status=12 opcode=0 len=0 vendor "
                f"err 129 (Send) hca mlx5_0\n".encode())
        n_out += f.write(prefix + b"NCCL INFO [Service thread] Connection closed by localRank "
                         + str(local).encode() + b"\n")

    # ---- stderr: logging progress lines, warnings, tqdm, then the end. The body is the same
    # text on every rank (DDP ranks log the same global step and loss); only lines that carry
    # the rank are filled in per rank.
    end_blob = cuda_error_tail(rank) if culprit else watchdog_tail(
        rank, plant["seq"], plant["numel"], rng)
    n_err = 0
    with open(os.path.join(d, f"rank-{rank}.stderr"), "wb", buffering=1 << 20) as f:
        for blob, has_ph in bk.stderr_body(max(err_target - 6000, 0)):
            n_err += f.write(fill(blob) if has_ph else blob)
        n_err += f.write(end_blob)
    return n_out, n_err


# ----------------------------------------------------------------------------- node / job files

NOISE = [
    "perf: interrupt took too long ({a} > {b}), lowering kernel.perf_event_max_sample_rate to {c}",
    "hrtimer: interrupt took {d} ns",
    "TCP: request_sock_TCP: Possible SYN flooding on port 29500. Sending cookies.  Check SNMP "
    "counters.",
    "kauditd_printk_skb: {e} callbacks suppressed",
    "audit: type=1400 audit({f}.{g}:{e}): apparmor=\"DENIED\" operation=\"open\" "
    "profile=\"snap.lxd.activate\" name=\"/proc/{e}/mounts\" pid={e} comm=\"snap-exec\"",
    "workqueue: drm_fb_helper_damage_work hogged CPU for >10000us 4 times, consider switching to "
    "WQ_UNBOUND",
    "sched: RT throttling activated",
    "IPv6: ADDRCONF(NETDEV_CHANGE): ib{h}: link becomes ready",
    "process 'python3' launched '/bin/sh' with NULL argv: empty string added",
    "Lustre: lustre-MDT0000-mdc-ffff8f3c: Connection restored to 10.40.0.{h} (at 10.40.0.{h}@o2ib)",
]


def write_journal(path: str, node: str, ni: int, kb: int, seed: int, plant: dict) -> int:
    rng = random.Random(seed * 7919 + ni)
    lines = []
    size = 0
    n = max(int(kb * 1000 / 140), 5)
    times = sorted(JOB_START + rng.random() * (JOB_END - JOB_START) for _ in range(n))
    for t in times:
        tmpl = NOISE[rng.randrange(len(NOISE))]
        msg = tmpl.format(a=2500 + rng.randrange(900), b=2500, c=79750 - rng.randrange(20000),
                          d=1_000_000 + rng.randrange(900_000), e=rng.randrange(10, 9999),
                          f=DAY0_EPOCH + int(t), g=rng.randrange(1000), h=rng.randrange(8))
        lines.append((t, f"{iso(t)} {node} kernel: {msg}"))
    if ni == plant["node_index"]:
        bus = plant["bus"]
        t = FAIL_AT
        for m in [
            f"NVRM: GPU at PCI:0000:{bus}:00: GPU-93b176db-0ede-fb67-8b5e-4a7d20e99e{ni % 100:02d}",
            "NVRM: GPU Board Serial Number: 1659445667383",
            f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
            "off the bus.",
            f"NVRM: GPU 0000:{bus}:00.0: GPU has fallen off the bus.",
            "NVRM: A GPU crash dump has been created. If possible, please run",
            "NVRM: nvidia-bug-report.sh as root to collect this data before",
            "NVRM: the NVIDIA kernel module is unloaded.",
        ]:
            lines.append((t + 0.0001, f"{iso(t)} {node} kernel: {m}"))
        lines.sort(key=lambda x: x[0])
    with open(path, "w", encoding="utf-8") as f:
        for _, ln in lines:
            size += f.write(ln + "\n")
    return size


JOB_TXT = """JobId={jobid} JobName=pt70b-stage3
   UserId=skim(20417) GroupId=ml(5002) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=ml-core QOS=normal
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   Requeue=0 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=134:0
   DerivedExitCode=0:0
   RunTime={runtime} TimeLimit=2-00:00:00 TimeMin=N/A
   SubmitTime=2026-03-09T05:41:02 EligibleTime=2026-03-09T05:41:02
   AccrueTime=2026-03-09T05:41:02
   StartTime={start} EndTime={end} Deadline=N/A
   SuspendTime=None SecsPreSuspend=0 LastSchedEval={start} Scheduler=Backfill
   Partition=h100 AllocNode:Sid=login01:2468155
   ReqNodeList=(null) ExcNodeList=(null)
   NodeList={nodelist}
   BatchHost={batch}
   NumNodes={nnodes} NumCPUs={ncpus} NumTasks={ntasks} CPUs/Task=14 ReqB:S:C:T=0:0:*:*
   ReqTRES=cpu={ncpus},mem={mem}G,node={nnodes},billing={ncpus},gres/gpu={ntasks}
   AllocTRES=cpu={ncpus},mem={mem}G,node={nnodes},billing={ncpus},gres/gpu={ntasks}
   Socks/Node=* NtasksPerN:B:S:C={rpn}:0:*:* CoreSpec=*
   JOB_GRES=gpu:h100:{ntasks}
     Nodes={nodelist} CPU_IDs=0-111 Mem=2048000 GRES=gpu:h100:{rpn}(IDX:0-{rpnm1})
   MinCPUsNode=112 MinMemoryNode=2000G MinTmpDiskNode=0
   Features=(null) DelayBoot=00:00:00
   OverSubscribe=NO Contiguous=0 Licenses=(null) Network=(null)
   Command=/home/skim/runs/pt70b/launch.sbatch
   WorkDir=/home/skim/runs/pt70b
   StdErr=/home/skim/runs/pt70b/logs/slurm-{jobid}.out
   StdIn=/dev/null
   StdOut=/home/skim/runs/pt70b/logs/slurm-{jobid}.out
   Power=
   TresPerNode=gres/gpu:{rpn}

"""


# ----------------------------------------------------------------------------- main


def generate(out: str, nodes: int, rpn: int, mb_per_rank: float, seed: int = 1,
             journal_kb: int = 32, job_id: int = 9_034_117, quiet: bool = True) -> dict:
    t_start = time.perf_counter()
    rng = random.Random(seed)
    names = node_names(nodes)
    nranks = nodes * rpn
    ni = rng.randrange(nodes) if nodes < 3 else 1 + rng.randrange(nodes - 2)
    local = rng.randrange(rpn)
    plant = {
        "node": names[ni], "node_index": ni, "rank": ni * rpn + local, "local_rank": local,
        "bus": BUS[local % 8], "gpu": f"0000:{BUS[local % 8]}:00.0",
        "category": "gpu_hardware", "seq": 418_000 + rng.randrange(1000),
        "numel": 139_460_608,
        "xid_time": iso_z(FAIL_AT) + "Z",
    }
    # Ranks on the neighbouring nodes that talked to the lost GPU over IB (symptoms).
    others = [i for i in (ni - 1, ni + 1) if 0 <= i < nodes]
    plant["ib_symptom_ranks"] = [i * rpn + local for i in others]
    bk = Blocks(rng, nranks, nodes, rpn)

    os.makedirs(out, exist_ok=False)
    os.makedirs(os.path.join(out, "slurm"))
    os.makedirs(os.path.join(out, "logs"))
    with open(os.path.join(out, "slurm", "job.txt"), "w") as f:
        f.write(JOB_TXT.format(
            jobid=job_id, runtime=hms(JOB_END - JOB_START), start=iso_z(JOB_START),
            end=iso_z(JOB_END), nodelist=hostlist(names), batch=names[0], nnodes=nodes,
            ncpus=nodes * 112, ntasks=nranks, mem=nodes * 2000, rpn=rpn, rpnm1=rpn - 1))
    with open(os.path.join(out, "logs", f"slurm-{job_id}.out"), "w") as f:
        f.write(f"==== job {job_id} on {hostlist(names)} start {iso_z(JOB_START)} ====\n"
                f"MASTER_ADDR={names[0]} MASTER_PORT=29500 WORLD_SIZE={nranks} NNODES={nodes}\n"
                "NCCL_DEBUG=INFO TORCH_NCCL_ASYNC_ERROR_HANDLING=1\n"
                "per-rank output: <node>/rank-<N>.{stdout,stderr}\n")
        f.write(f"srun: error: {plant['node']}: task {plant['rank']}: Aborted (core dumped)\n")
        for i, nm in enumerate(names):
            f.write(f"srun: error: {nm}: tasks {i * rpn}-{i * rpn + rpn - 1}: Exited with exit "
                    "code 1\n" if i != ni else "")
    target = int(mb_per_rank * MB)
    total_rank = total_journal = 0
    for i, nm in enumerate(names):
        d = os.path.join(out, nm)
        os.makedirs(d)
        total_journal += write_journal(os.path.join(d, "journal.log"), nm, i, journal_kb, seed,
                                       plant)
        for lr in range(rpn):
            a, b = write_rank(bk, d, nm, i, lr, i * rpn + lr, target, seed, plant)
            total_rank += a + b
        if not quiet and (i + 1) % max(1, nodes // 16) == 0:
            el = time.perf_counter() - t_start
            print(f"  {i + 1}/{nodes} nodes, {total_rank / MB:,.0f} MB, {el:.1f}s "
                  f"({total_rank / MB / el:,.0f} MB/s)", file=sys.stderr)
    elapsed = time.perf_counter() - t_start
    info = {
        "out": out, "nodes": nodes, "ranks_per_node": rpn, "mb_per_rank": mb_per_rank,
        "seed": seed, "job_id": str(job_id), "rank_log_bytes": total_rank,
        "journal_bytes": total_journal, "files": nodes * (2 * rpn + 1) + 2,
        "generate_seconds": round(elapsed, 2),
        "planted": {k: plant[k] for k in ("node", "rank", "gpu", "category", "xid_time",
                                           "ib_symptom_ranks")},
    }
    with open(os.path.join(out, "_planted.json"), "w") as f:
        json.dump(info, f, indent=2)
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--mb-per-rank", type=float, default=1.5,
                    help="stdout+stderr bytes per rank, in MB (10^6 bytes)")
    ap.add_argument("--journal-kb", type=int, default=32, help="kernel log size per node")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--job-id", type=int, default=9_034_117)
    ap.add_argument("--out", required=True)
    ap.add_argument("--force", action="store_true", help="delete OUT first if it exists")
    a = ap.parse_args(argv)
    if a.nodes < 1 or a.ranks_per_node < 1 or a.ranks_per_node > 64:
        ap.error("need --nodes >= 1 and 1 <= --ranks-per-node <= 64")
    if os.path.exists(a.out):
        if not a.force:
            ap.error(f"{a.out} exists (use --force to replace it)")
        shutil.rmtree(a.out)
    need = a.nodes * a.ranks_per_node * a.mb_per_rank * MB
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(a.out))).free
    if need > free * 0.9:
        ap.error(f"needs ~{need / 1e9:.1f} GB, only {free / 1e9:.1f} GB free")
    info = generate(a.out, a.nodes, a.ranks_per_node, a.mb_per_rank, a.seed, a.journal_kb,
                    a.job_id, quiet=False)
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
