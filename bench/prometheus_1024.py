"""bench: the Prometheus connector for a 1,024-node job against a real Prometheus.

    python bench/prometheus_1024.py [--nodes 1024] [--gpus 8] [--tmp DIR]

Backfills the recorded dcgm-exporter / node_exporter series (tests/data/prometheus) for every
node (GPU_UTIL and the Xid gauge for each GPU, the others once per node) into a fresh TSDB with
promtool, starts Debian's prometheus on a free loopback port, runs the connector as the
worker does, writes the bundle and analyzes it: prints the query count, the fetch time, the
bytes saved and where the diagnosis says the job stopped. One node's GPU 2 goes idle first
(the hang picture).
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from prometheus_server import Prometheus, exposition, openmetrics, steps  # noqa: E402

from sattrib.analysis import analyze_folder  # noqa: E402
from sattrib.collectors import prometheus  # noqa: E402
from sattrib.config import Settings  # noqa: E402

PCI = ["1B", "3B", "5D", "9A", "AB", "CB", "DB", "E1"]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--tmp", default=None)
    a = ap.parse_args()
    end = float(int(time.time()) // 60 * 60 - 120)
    start, first, others = end - 1200, end - 700, end - 400
    lo, hi = start - 400, end + 400
    x = exposition()
    nodes = [f"gpu-a{i:04d}" for i in range(a.nodes)]
    culprit = nodes[len(nodes) // 3]
    samples = []
    for node in nodes:
        for g in range(a.gpus):
            def gpu(t, g=g):
                return (t.replace('gpu="0"', f'gpu="{g}"').replace("nvidia0", f"nvidia{g}")
                        .replace(":3B:00.0", f":{PCI[g]}:00.0"))
            fell = first if (node, g) == (culprit, 2) else others
            samples.append((gpu(x["DCGM_FI_DEV_GPU_UTIL"]), node,
                            steps(lo, hi, lambda t, f=fell: 97 if start + 30 <= t < f else 0)))
            samples.append((gpu(x["DCGM_FI_DEV_XID_ERRORS"]), node, steps(lo, hi, lambda t: 0)))
        for name in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                     "node_infiniband_link_downed_total", "node_infiniband_state_id"):
            samples.append((x[name], node, steps(lo, hi, lambda t: 4)))
    tmp = Path(a.tmp or tempfile.mkdtemp(prefix="sattrib-prom-bench-"))
    t0 = time.monotonic()
    prom = Prometheus(tmp / "prom", openmetrics(samples))
    print(f"backfilled {len(samples)} series in {time.monotonic() - t0:.1f}s")
    try:
        st = Settings(prometheus_url=prom.url)
        got = prometheus.fetch(st, nodes, start, end, time.monotonic() + 600)
    finally:
        prom.stop()
    folder = tmp / "job"
    (folder / "slurm").mkdir(parents=True)
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731
    (folder / "slurm" / "job.txt").write_text(
        f"JobId=9200 JobState=FAILED ExitCode=1:0\n   StartTime={iso(start)} "
        f"EndTime={iso(end)}\n   NodeList=gpu-a[0000-{a.nodes - 1:04d}]\n")
    prometheus.write_bundle(folder, got)
    size = sum(p.stat().st_size for p in folder.glob("*/metrics.json"))
    t1 = time.monotonic()
    d, _ = analyze_folder(folder)
    loc = d.localization
    print(json.dumps({"nodes": a.nodes, "gpus_per_node": a.gpus, "queries": got.queries,
                      "fetch_seconds": round(got.seconds, 2),
                      "budget_s": st.prometheus_budget_s, "notes": got.notes,
                      "metrics_json_bytes": size,
                      "analyze_seconds": round(time.monotonic() - t1, 2),
                      "outcome": d.outcome.value,
                      "localization": loc and [loc.nodes, loc.how],
                      "expected": [culprit, "0000:5d:00.0"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
