"""bench: `sattrib analyze` on the flight-recorder dumps of a 1,024-rank hang.

    python bench/flight_recorder_1024.py [--ranks 1024] [--entries 2000] [--frames 16]
                                         [--only-active] [--tmp DIR]

Writes one dump per rank (tests/fr_dumps.py: PyTorch's format 2.9, the full ring buffer as a
watchdog timeout dumps it, each entry with its stack frames) into an evidence folder of 8 ranks
per node, laid out as Megatron lays out tensor (8, inside a node), pipeline (4) and data
(the rest) parallel groups. One rank never scheduled the data-parallel all_reduce its 31 peers
wait in; the 7 others of its node wait for it in a tensor-parallel collective. Then analyzes
the folder in a fresh process and prints its wall time, CPU time and peak memory (its own and
its largest child's, the dump readers), and what it localized; then the same for the folder the
controller builds when the nodes' Epilogs ship the dumps' facts instead of the dumps (and how
long each node took to read its eight).
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fr_dumps import Job  # noqa: E402

MEASURE = r"""
import json, resource, sys, time
t0 = time.monotonic()
from sattrib.analysis import analyze_folder
d, bundle = analyze_folder(sys.argv[1])
took = time.monotonic() - t0
me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
loc = d.localization
print(json.dumps({"seconds": round(took, 2), "peak_mb": round(max(me.ru_maxrss,
                                                                    kids.ru_maxrss) / 1024),
                  "cpu_seconds": round(me.ru_utime + me.ru_stime + kids.ru_utime
                                       + kids.ru_stime, 1),
                  "lines": len(bundle.lines), "outcome": d.outcome.value,
                  "ranks": loc and loc.ranks, "nodes": loc and loc.nodes,
                  "how": loc and loc.how}))
"""


def layout(ranks: int, culprit: int, only_active: bool = False) -> Job:
    tp, pp = 8, 4
    dp = ranks // (tp * pp)
    job = Job(ranks, per_node=8, only_active=only_active)
    for g in range(ranks // tp):
        job.group(f"tp{g}", "TENSOR_MODEL_PARALLEL_GROUP", list(range(g * tp, g * tp + tp)))
    for base in range(ranks // pp):
        job.group(f"pp{base}", "PIPELINE_MODEL_PARALLEL_GROUP",
                  [base + s * (ranks // pp) for s in range(pp)])
    for s in range(pp):
        for t in range(tp):
            job.group(f"dp{s}.{t}", "DATA_PARALLEL_GROUP",
                      [s * (ranks // pp) + d * tp + t for d in range(dp)])
    job.at("0", range(ranks), 10, 10)
    for name, (_, members) in job.groups.items():
        if name.startswith("tp"):
            stuck = culprit in members
            job.at(name, members, 5001 if stuck else 5000, 5000, "_all_gather_base")
        elif name.startswith("dp"):
            job.at(name, members, 1001, 1000, "all_reduce")
    for name in job.groups:
        if (name, culprit) in job.progress and name != "0":
            done = job.progress[(name, culprit)][1]
            job.at(name, [culprit], done, done)        # it scheduled nothing past the last
    return job


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000, help="ring buffer entries per rank")
    ap.add_argument("--frames", type=int, default=16, help="stack frames per entry")
    ap.add_argument("--only-active", action="store_true",
                    help="only the entries not completed (as nvidia-resiliency-ext recorded)")
    ap.add_argument("--tmp", default=None)
    a = ap.parse_args()
    culprit = a.ranks // 2 + 5
    job = layout(a.ranks, culprit, a.only_active)
    job.history = a.entries // 2            # tensor- and data-parallel collectives, half each
    job.frames = a.frames
    folder = Path(a.tmp or tempfile.mkdtemp(prefix="sattrib-fr-bench-")) / "job"
    t0 = time.monotonic()
    job.write(folder)
    (folder / "slurm").mkdir(exist_ok=True)
    nodes = a.ranks // 8
    (folder / "slurm" / "job.txt").write_text(
        f"JobId=9300 JobState=FAILED ExitCode=1:0\n   NodeList=node-[01-{nodes:02d}] "
        f"NumNodes={nodes} NumTasks={a.ranks}\n   NtasksPerN:B:S:C=8:0:*:*\n")
    size = sum(p.stat().st_size for p in folder.glob("node-*/nccl_trace_rank_*"))
    print(f"wrote {a.ranks} dumps ({size / 1e6:.0f} MB) in {time.monotonic() - t0:.1f}s "
          f"to {folder}", file=sys.stderr)
    shipped, per_node = ship(folder)
    out = {}
    for name, path in (("dumps", folder), ("shipped", shipped)):
        run = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True,
                             text=True, check=True)
        out[name] = json.loads(run.stdout)
    print(json.dumps(dict(out, ranks=a.ranks, dump_mb=round(size / 1e6),
                          node_epilog_seconds={"max": round(max(per_node), 2),
                                               "mean": round(sum(per_node) / len(per_node), 2)},
                          expected=[culprit, job.node(culprit)]), indent=1))
    return 0 if all(o["ranks"] == [culprit] for o in out.values()) else 1


def ship(folder: Path) -> tuple[Path, list]:
    """The folder as the controller builds it when the node Epilogs ship their dumps' facts
    (collectors/flight_recorder.ship): each node's dumps read there, in its own child, into its
    flight-recorder.json. Returns it and each node's reading time."""
    from sattrib.collectors import flight_recorder
    out = folder.with_name("shipped")
    per_node = []
    for node in sorted(p for p in folder.iterdir() if p.name.startswith("node-")):
        paths = sorted(str(p) for p in node.glob("nccl_trace_rank_*"))
        t = time.monotonic()
        got = flight_recorder.read_all(paths, None, flight_recorder.MAX_BYTES,
                                       time.monotonic() + 60)
        per_node.append(time.monotonic() - t)
        (out / node.name).mkdir(parents=True, exist_ok=True)
        (out / node.name / flight_recorder.FACTS_NAME).write_text(flight_recorder.facts_text(
            [dict(r, source=p) for p, r in zip(paths, got)]))
    (out / "slurm").mkdir(exist_ok=True)
    (out / "slurm" / "job.txt").write_text((folder / "slurm" / "job.txt").read_text())
    return out, per_node


if __name__ == "__main__":
    sys.exit(main())
