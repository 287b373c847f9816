"""Flight-recorder dumps in PyTorch's format 2.x (FlightRecorderDetail.hpp), for the shapes the
recorded nvidia-resiliency-ext scenarios lack: written as the C++ pickler writes them (protocol
2, plain dicts, lists, tuples, strings and numbers), one per rank.

A rank's progress in a group is given as (scheduled, completed): it enqueued the group's
collectives up to `scheduled` and saw them complete up to `completed`; what lies between is in
flight. Point-to-point operations in flight are given as (kind, peer) pairs.
"""
from __future__ import annotations

import pickle
from pathlib import Path

T0 = 1_758_610_000_000_000_000        # ns


class Job:
    """`world` ranks on nodes of `per_node`; groups by name: (desc, member ranks)."""

    def __init__(self, world: int, per_node: int = 8, only_active: bool = True, t0: int = T0):
        self.world, self.per_node, self.only_active, self.t0 = world, per_node, only_active, t0
        self.groups: dict = {"0": ("default_pg", list(range(world)))}
        self.progress: dict = {}       # (group, rank) -> (scheduled, completed, op, started)
        self.p2p: dict = {}            # (group, rank) -> [(kind, peer, seq)]
        self.history = 4               # completed collectives kept per group (full dumps)
        self.frames = 0                # stack frames per entry (TORCH_NCCL_TRACE_CPP_STACK...)

    def node(self, rank: int) -> str:
        return f"node-{rank // self.per_node + 1:02d}"

    def group(self, name: str, desc: str, members: list) -> None:
        self.groups[name] = (desc, list(members))

    def at(self, name: str, ranks, scheduled: int, completed: int, op: str = "all_reduce",
           started: int = -1) -> None:
        for r in ranks:
            self.progress[(name, r)] = (scheduled, completed, op, started)

    def waits(self, name: str, rank: int, kind: str, peer: int, seq: int = 10) -> None:
        self.p2p.setdefault((name, rank), []).append((kind, peer, seq))

    def dump(self, rank: int) -> dict:
        entries, status, rid = [], {}, 0
        config = {}
        for pg_id, (name, (desc, members)) in enumerate(sorted(self.groups.items())):
            if rank not in members:
                continue
            config[name] = {"name": name, "desc": desc, "ranks": str(members)}
            sched, done, op, started = self.progress.get((name, rank), (0, 0, "all_reduce", -1))
            status[str(pg_id)] = {"last_enqueued_collective": sched,
                                  "last_started_collective": started,
                                  "last_completed_collective": done}
            first = done + 1 if self.only_active else max(1, done - self.history + 1)
            for seq in range(first, sched + 1):
                state = ("completed" if seq <= done else
                         "started" if seq <= started else "scheduled")
                entries.append(_entry(self.t0, rid, pg_id, name, desc, seq, 0, f"nccl:{op}",
                                      state))
                rid += 1
            for kind, peer, seq in self.p2p.get((name, rank), []):
                arrow = "->" if kind == "send" else "<-"
                label = f"nccl:{kind} {members.index(rank)}{arrow}{members.index(peer)}"
                entries.append(_entry(self.t0, rid, pg_id, name, desc, sched, seq, label,
                                      "scheduled", p2p=True))
                rid += 1
        if self.frames:
            # One dict per distinct frame, shared by the entries (the C++ pickler's memo writes
            # each once, the later ones as references), in a list of each entry's own.
            stack = [{"name": f"fn{i}", "filename": f"/app/train/layer{i}.py", "line": 100 + i}
                     for i in range(self.frames)]
            for e in entries:
                e["frames"] = list(stack)
        return {"version": "2.9", "pg_config": config, "nccl_version": "2.27.3",
                "pg_status": status, "entries": entries}

    def write(self, root: Path, skip=(), empty=()) -> Path:
        """The evidence folder: node-NN/nccl_trace_rank_<r> for each rank not in `skip`; the
        ranks in `empty` wrote a dump with no entries."""
        for r in range(self.world):
            if r in skip:
                continue
            d = self.dump(r)
            if r in empty:
                d["entries"] = []
            path = root / self.node(r) / f"nccl_trace_rank_{r}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(pickle.dumps(d, protocol=2))
        return root


def _entry(t0, rid, pg_id, name, desc, seq, p2p_seq, profiling, state, p2p=False) -> dict:
    t = t0 + rid * 1_000_000
    return {"record_id": rid, "pg_id": pg_id, "process_group": (name, desc),
            "thread_name": "pt_main_thread", "thread_id": "140000000000000",
            "collective_seq_id": seq, "p2p_seq_id": p2p_seq, "op_id": seq,
            "profiling_name": profiling, "time_created_ns": t,
            "input_sizes": [[4096, 1024]], "input_dtypes": ["BFloat16"],
            "output_sizes": [[4096, 1024]], "output_dtypes": ["BFloat16"], "state": state,
            "time_discovered_started_ns": t + 1000 if state != "scheduled" else None,
            "time_discovered_completed_ns": t + 2000 if state == "completed" else None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": p2p}
