#!/usr/bin/env python3
"""The controller's cost of a big job both ways: copying the rank output, or writing the nodes'
extracts (collectors/output_lines.py), and what the extract costs one node's Epilog.

    python bench/scaleout.py --nodes 1024            # generate (12 GB), measure, delete
    python bench/scaleout.py --nodes 16 --keep DIR   # keep the generated job in DIR

Steps, on a job from bench/make_job.py (rank files in each node's folder):
  1. node side: for a few nodes, a fresh `python` that does what the Epilog does for that
     node's rank files (node_output.ship: load the rules, scan each file in a child process
     with a deadline); wall time, peak RSS of the process and of its child.
  2. the extracts of every node (made in this process, as the nodes would, one file each).
  3. copy: the controller's copy of every rank file (slurm_job.copy_outputs, as the worker
     does) into a bundle, then `sattrib analyze BUNDLE --json`.
  4. extracts: the same bundle with the extracts written in place of the copies, then
     `sattrib analyze BUNDLE --json`.
  Both diagnoses must be the same, byte for byte. Bytes read by the controller: the rank
  files it copies plus every file of the bundle the analysis reads (each is read whole).
MB = 10^6 bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True
import run as bench  # noqa: E402

MB = 1_000_000

NODE_SIDE = """
import json, os, resource, sys, time
t0 = time.monotonic()
from sattrib.analysis import reader_limits
from sattrib.collectors import node_output
from sattrib.config import Settings
paths = sys.argv[1:]
st = Settings()
out, notes = node_output.ship(paths, os.getuid(), st.output_cap_mb << 20, reader_limits(st),
                              [], time.monotonic() + st.epilog_budget_s)
print(json.dumps({"wall_s": time.monotonic() - t0, "files": len(paths), "shipped": len(out),
                  "notes": notes, "chars": sum(len(o["lines"]) for o in out),
                  "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6,
                  "child_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                  * 1024 / 1e6}))
"""


def rank_files(job: Path) -> list[Path]:
    return sorted(p for p in job.glob("*/rank-*") if p.is_file())


def node_side(py: str, job: Path, nodes: list[str]) -> list[dict]:
    got = []
    for n in nodes:
        files = [str(p) for p in sorted((job / n).glob("rank-*"))]
        t = time.perf_counter()
        r = subprocess.run([py, "-c", NODE_SIDE, *files], capture_output=True, text=True,
                           check=True)
        got.append(dict(json.loads(r.stdout), process_s=time.perf_counter() - t))
    return got


def skeleton(job: Path, dest: Path) -> None:
    """The bundle without its rank output: slurm/, logs/, each node's own files."""
    shutil.copytree(job, dest, ignore=lambda d, names: [
        n for n in names if n.startswith("rank-") or n.startswith("_")])


def analyze(cmd: list[str], d: Path) -> tuple[dict, str]:
    with tempfile.TemporaryFile() as out:
        r = bench.run_child(cmd + ["analyze", str(d), "--json"], stdout=out)
        if r["rc"] != 0:
            sys.exit(f"sattrib analyze {d} failed: {r['stderr'][-2000:]}")
        out.seek(0)
        return r, out.read().decode()


def folder_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in bench.list_files(d)[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--mb-per-rank", type=float, default=1.5)
    ap.add_argument("--node-samples", type=int, default=3)
    ap.add_argument("--keep", help="generate into (or reuse) this folder and keep it")
    ap.add_argument("--sattrib")
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    cmd = bench.find_sattrib(a.sattrib)
    py = bench.venv_python(cmd)
    sys.path.insert(0, str(HERE.parent))
    from sattrib.analysis import load_rules, reader_limits
    from sattrib.collectors import output_lines, slurm_job
    from sattrib.collectors.evidence_folder import FolderReader
    from sattrib.config import Settings

    tmp = Path(tempfile.mkdtemp(prefix="sattrib-scaleout-"))
    job = Path(a.keep) if a.keep else tmp / "job"
    res: dict = {"nodes": a.nodes, "ranks_per_node": a.ranks_per_node,
                 "mb_per_rank": a.mb_per_rank}
    try:
        if not (job / "slurm" / "job.txt").is_file():
            t = time.perf_counter()
            subprocess.run([sys.executable, str(HERE / "make_job.py"), "--nodes", str(a.nodes),
                            "--ranks-per-node", str(a.ranks_per_node), "--mb-per-rank",
                            str(a.mb_per_rank), "--out", str(job)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"generated {job} in {time.perf_counter() - t:.0f}s", flush=True)
        ranks = rank_files(job)
        rank_bytes = sum(p.stat().st_size for p in ranks)
        node_names = sorted({p.parent.name for p in ranks})
        res["rank_files"], res["rank_mb"] = len(ranks), rank_bytes / MB
        bench.warm(ranks)

        # 1. one node's Epilog
        picks = node_names[:: max(1, len(node_names) // a.node_samples)][:a.node_samples]
        per_node = node_side(py, job, picks)
        res["node"] = {k: statistics.median(r[k] for r in per_node)
                       for k in ("wall_s", "process_s", "rss_mb", "child_rss_mb", "chars")}
        res["node"]["files"] = per_node[0]["files"]
        assert all(r["shipped"] == r["files"] for r in per_node), per_node
        print(f"node Epilog, {per_node[0]['files']} rank files: "
              f"{res['node']['wall_s']:.2f}s ({res['node']['process_s']:.2f}s with the "
              f"interpreter's start), RSS {res['node']['rss_mb']:.0f} MB "
              f"(scanner child {res['node']['child_rss_mb']:.0f} MB), ships "
              f"{res['node']['chars'] / 1e3:.0f} kB", flush=True)

        # 2. every node's extracts, as the nodes would make them
        st = Settings()
        rules = load_rules()
        reader = FolderReader(rules, limits=reader_limits(st))
        t = time.perf_counter()
        extracts = {p: output_lines.extract(str(p), None, st.output_cap_mb << 20, reader,
                                            rules.version)["lines"] for p in ranks}
        res["all_nodes_extract_cpu_s"] = time.perf_counter() - t

        # 3. the controller copies every rank file, then analyzes
        copy_dir = tmp / "bundle-copy"
        skeleton(job, copy_dir)
        pairs = [(str(p), copy_dir / p.relative_to(job)) for p in ranks]
        t = time.perf_counter()
        notes: list = []
        slurm_job.copy_outputs(pairs, os.getuid(), st.output_cap_mb << 20, notes,
                               time.monotonic() + 3600)
        copy_s = time.perf_counter() - t
        r_copy, want = analyze(cmd, copy_dir)
        res["copy"] = {"write_s": copy_s, "analyze_s": r_copy["wall_s"],
                       "analyze_rss_mb": r_copy["rss_mb"],
                       "read_mb": (rank_bytes + folder_bytes(copy_dir)) / MB}
        shutil.rmtree(copy_dir)

        # 4. the controller writes the nodes' extracts, then analyzes
        lines_dir = tmp / "bundle-lines"
        skeleton(job, lines_dir)
        t = time.perf_counter()
        for p, text in extracts.items():
            (lines_dir / p.relative_to(job)).with_name(p.name + output_lines.SUFFIX) \
                .write_text(text)
        write_s = time.perf_counter() - t
        r_lines, got = analyze(cmd, lines_dir)
        res["lines"] = {"write_s": write_s, "analyze_s": r_lines["wall_s"],
                        "analyze_rss_mb": r_lines["rss_mb"],
                        "read_mb": folder_bytes(lines_dir) / MB,
                        "extract_mb": sum(len(t.encode()) for t in extracts.values()) / MB}
        res["same_diagnosis"] = got == want
        d = json.loads(got)
        res["root_cause"] = [d["outcome"], (d["root_cause"] or {}).get("node"),
                             (d["root_cause"] or {}).get("category")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    c, s = res["copy"], res["lines"]
    print(f"{a.nodes} nodes x {a.ranks_per_node} ranks x {a.mb_per_rank} MB "
          f"({res['rank_files']} rank files, {res['rank_mb'] / 1e3:.1f} GB):")
    print(f"  copy    : copy {c['write_s']:6.1f}s + analyze {c['analyze_s']:6.1f}s "
          f"= {c['write_s'] + c['analyze_s']:6.1f}s, reads {c['read_mb']:9.0f} MB, "
          f"analyze RSS {c['analyze_rss_mb']:.0f} MB")
    print(f"  extracts: write {s['write_s']:6.1f}s + analyze {s['analyze_s']:6.1f}s "
          f"= {s['write_s'] + s['analyze_s']:6.1f}s, reads {s['read_mb']:9.0f} MB "
          f"({s['extract_mb']:.0f} MB of extracts), analyze RSS {s['analyze_rss_mb']:.0f} MB")
    print(f"  same diagnosis both ways: {res['same_diagnosis']} {res['root_cause']}")
    print(f"  (all nodes' extracts made in one process here: {res['all_nodes_extract_cpu_s']:.0f}s)")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["same_diagnosis"] else 1


if __name__ == "__main__":
    sys.exit(main())
