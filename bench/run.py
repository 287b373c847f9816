#!/usr/bin/env python3
"""Benchmark `sattrib analyze DIR --json` against grep over the same files and literals.

    python bench/run.py DIR                        measure an existing evidence folder
    python bench/run.py --nodes 256                generate one (bench/make_job.py), measure, delete
    python bench/run.py --sizes 16,256,1024        the same for each size in turn
    add --json for machine-readable results, --profile to also cProfile one sattrib run

Measured, on a warm page cache (every file is read once first):
  - sattrib analyze DIR --json: wall time, peak RSS, user/sys CPU (os.wait4 rusage of the child),
    MB/s over all bytes in the folder; and whether the diagnosis names the planted culprit
    (outcome attributed, root_cause.node and category as planted, from DIR/_planted.json).
  - grep -E (LC_ALL=C, -a -r -c; -a so files with a NUL byte are read as text, as sattrib does) with the same literal set the sattrib prefilter uses
    (RuleSet.literal_keys, each escaped for ERE; caseless literals in a second `grep -i` pass,
    whose time is added). Same files: `_*`, `.*` and expected.json are excluded as sattrib
    skips them.
  - ripgrep: `rg -F -a -c -j<cores>` with the same literals (caseless ones in a second `-i`
    pass, time added), the same exclusions, no ignore files. Install it with bench/setup.sh;
    without rg the row is left out with a one-line note.
  - extras (skip with --quick): grep -F with the same literals, and the Hyperscan prefilter alone
    (sattrib's own literal database scanning the files in 8 MiB chunks from Python), the floor
    below which sattrib cannot go without changing its prefilter.
  - --start: best-of-5 wall time of `sattrib analyze DIR --json` on a folder holding only
    slurm/job.txt, with the rule cache removed before each run (cold) and with it in place (warm).
MB = 10^6 bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True
import make_job  # noqa: E402

MB = 1_000_000


# ----------------------------------------------------------------------------- helpers


# sattrib with `import hyperscan` failing, as where no wheel exists (the rule cache keys on it).
NO_HYPERSCAN = ("import sys; sys.modules['hyperscan'] = None; sys.argv[0] = 'sattrib'; "
                "from sattrib.cli import main; sys.exit(main())")


def find_sattrib(explicit: str | None) -> list[str]:
    if explicit:
        return explicit.split()
    cand = Path(sys.executable).parent / "sattrib"
    if cand.exists():
        return [str(cand)]
    w = shutil.which("sattrib")
    if w:
        return [w]
    sys.exit("cannot find the sattrib command (use --sattrib)")


def venv_python(sattrib_cmd: list[str]) -> str:
    """The interpreter that runs sattrib (for the prefilter floor and profiling)."""
    p = Path(sattrib_cmd[0])
    py = p.parent / "python"
    return str(py) if py.exists() else sys.executable


def list_files(root: Path) -> tuple[list[Path], int, int]:
    """Files sattrib reads, total bytes, rank-log bytes."""
    files, total, rank = [], 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "_")))
        for fn in sorted(filenames):
            if fn.startswith((".", "_")) or (rel == "." and fn == "expected.json"):
                continue
            p = Path(dirpath) / fn
            st = p.lstat()
            if not p.is_file() or p.is_symlink():
                continue
            files.append(p)
            total += st.st_size
            top = rel.split(os.sep)[0]
            if top == "logs" or (top not in (".", "slurm") and
                                 re.search(r"(^rank|\.(stderr|stdout|err|out)$)", fn)):
                rank += st.st_size
    return files, total, rank


def warm(files: list[Path]) -> float:
    t = time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass
    return time.perf_counter() - t


def run_child(cmd: list[str], env=None, stdout=subprocess.DEVNULL) -> dict:
    """Run a command; wall time plus its own rusage (peak RSS, CPU) via wait4."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    p.stderr.close()
    return {"wall_s": wall, "rss_mb": ru.ru_maxrss * 1024 / MB, "user_s": ru.ru_utime,
            "sys_s": ru.ru_stime, "rc": p.returncode, "stderr": err.decode("utf-8", "replace")}


def literal_keys(py: str) -> list[tuple[str, bool]]:
    out = subprocess.run([py, "-c", "import json; from sattrib.engine.rules import load_rules;"
                          "print(json.dumps(load_rules().literal_keys))"],
                         check=True, capture_output=True, text=True).stdout
    return [(s, bool(ci)) for s, ci in json.loads(out)]


def ere_escape(s: str) -> str:
    return re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", s)


# ----------------------------------------------------------------------------- measurements


def median_run(runs: list[dict]) -> dict:
    """The run of median wall time (the lower of the two middle ones for an even count), with
    every run's wall time beside it: on a shared machine one lucky or unlucky run says little."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    med = dict(ordered[(len(ordered) - 1) // 2])
    med["walls_s"] = [round(r["wall_s"], 3) for r in runs]
    med["runs"] = len(runs)
    return med


def sattrib_once(cmd: list[str], d: Path) -> dict:
    with tempfile.TemporaryFile() as out:
        r = run_child(cmd + ["analyze", str(d), "--json"], stdout=out)
        if r["rc"] != 0:
            raise SystemExit(f"sattrib failed (rc {r['rc']}):\n{r['stderr'][-3000:]}")
        out.seek(0)
        r["diagnosis"] = json.loads(out.read())
    r.pop("stderr", None)
    return r


def measure_sattrib(cmd: list[str], d: Path, repeat: int) -> dict:
    return median_run([sattrib_once(cmd, d) for _ in range(repeat)])


def measure_grep(mode: str, lits: list[tuple[str, bool]], d: Path, tmp: Path,
                 repeat: int = 1) -> dict:
    return median_run([_grep_once(mode, lits, d, tmp) for _ in range(repeat)])


def _grep_once(mode: str, lits: list[tuple[str, bool]], d: Path, tmp: Path) -> dict:
    """grep -E or -F over the folder; caseless literals in a second -i pass."""
    env = dict(os.environ, LC_ALL="C")
    res = {"wall_s": 0.0, "user_s": 0.0, "sys_s": 0.0, "rss_mb": 0.0, "lines": 0, "passes": 0}
    for ci in (False, True):
        pats = [ere_escape(s) if mode == "E" else s for s, c in lits if c == ci]
        if not pats:
            continue
        pf = tmp / f"pats-{mode}-{int(ci)}.txt"
        pf.write_text("\n".join(pats) + "\n")
        cmd = ["grep", f"-{mode}", "-a", "-r", "-c", "--exclude=_*", "--exclude=.*",
               "--exclude=expected.json", "--exclude-dir=_*", "--exclude-dir=.*",
               "-f", str(pf), str(d)]
        if ci:
            cmd.insert(1, "-i")
        with tempfile.TemporaryFile() as out:
            r = run_child(cmd, env=env, stdout=out)
            if r["rc"] not in (0, 1):
                raise SystemExit(f"grep failed: {r['stderr'][-2000:]}")
            out.seek(0)
            n = sum(int(ln.rsplit(b":", 1)[1]) for ln in out.read().splitlines() if ln)
        for k in ("wall_s", "user_s", "sys_s"):
            res[k] += r[k]
        res["rss_mb"] = max(res["rss_mb"], r["rss_mb"])
        res["lines"] += n          # with two passes a line can be counted twice
        res["passes"] += 1
        res["patterns" if not ci else "patterns_caseless"] = len(pats)
    return res


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _rg_once(lits: list[tuple[str, bool]], d: Path, tmp: Path) -> dict:
    """rg -F over the folder with grep's exclusions; caseless literals in a second -i pass.
    --no-ignore and --no-config: no .gitignore or user config changes what is searched;
    hidden files are skipped by rg's default, as `--exclude=.*` does for grep."""
    res = {"wall_s": 0.0, "user_s": 0.0, "sys_s": 0.0, "rss_mb": 0.0, "lines": 0, "passes": 0,
           "threads": cores()}
    for ci in (False, True):
        pats = [s for s, c in lits if c == ci]
        if not pats:
            continue
        pf = tmp / f"pats-rg-{int(ci)}.txt"
        pf.write_text("\n".join(pats) + "\n")
        cmd = ["rg", "--no-config", "--no-ignore", "-F", "-a", "-c", f"-j{cores()}",
               "-g", "!_*", "-g", "!expected.json", "-f", str(pf), str(d)]
        if ci:
            cmd.insert(1, "-i")
        with tempfile.TemporaryFile() as out:
            r = run_child(cmd, stdout=out)
            if r["rc"] not in (0, 1):
                raise SystemExit(f"rg failed: {r['stderr'][-2000:]}")
            out.seek(0)
            n = sum(int(ln.rsplit(b":", 1)[1]) for ln in out.read().splitlines() if ln)
        for k in ("wall_s", "user_s", "sys_s"):
            res[k] += r[k]
        res["rss_mb"] = max(res["rss_mb"], r["rss_mb"])
        res["lines"] += n
        res["passes"] += 1
    return res


RG_MISSING = ("bench: ripgrep (rg) is not installed, so the rg row is left out "
              "(hint: run `sudo bench/setup.sh`, or `apt-get install ripgrep`)")


def startup_folder(tmp: Path, job_txt: Path | None) -> Path:
    """A folder holding only slurm/job.txt: what a start costs before any evidence."""
    mini = tmp / "startup-only"
    shutil.rmtree(mini, ignore_errors=True)
    (mini / "slurm").mkdir(parents=True)
    if job_txt is not None and job_txt.is_file():
        shutil.copy(job_txt, mini / "slurm" / "job.txt")
    else:                           # the job record of a one-node generated job
        make_job.generate(str(tmp / "tiny"), 1, 1, 0.01, 1)
        shutil.copy(tmp / "tiny" / "slurm" / "job.txt", mini / "slurm" / "job.txt")
        shutil.rmtree(tmp / "tiny")
    return mini


def rule_cache_dir(py: str) -> Path:
    """Where that sattrib caches its compiled rules (a version without the cache: nowhere)."""
    return Path(subprocess.run(
        [py, "-c", "from sattrib.engine.rule_cache import cache_dir; print(cache_dir() or '')"],
        capture_output=True, text=True).stdout.strip() or "/nonexistent")


def measure_start(cmd: list[str], py: str, tmp: Path, runs: int = 5) -> dict:
    """Best-of-N wall time of the start, without (cold) and with (warm) the rule cache."""
    mini = startup_folder(tmp, None)
    cache = rule_cache_dir(py)
    out: dict = {"cache_dir": str(cache), "runs": runs}
    for label in ("cold", "warm"):
        best = None
        for _ in range(runs):
            if label == "cold":
                for f in cache.glob("*.pickle"):
                    f.unlink()
            r = run_child(cmd + ["analyze", str(mini), "--json"])
            if r["rc"] != 0:
                raise SystemExit(f"sattrib failed (rc {r['rc']}):\n{r['stderr'][-3000:]}")
            r.pop("stderr")
            if best is None or r["wall_s"] < best["wall_s"]:
                best = r
        out[label] = best
    return out


def print_start(st: dict) -> None:
    print(f"start: sattrib analyze DIR --json, DIR = only slurm/job.txt, best of {st['runs']}"
          f" (rule cache {st['cache_dir']})")
    print(f"  {'':<8}{'wall s':>8}{'user s':>8}{'sys s':>7}{'RSS MB':>8}")
    for label in ("cold", "warm"):
        r = st[label]
        print(f"  {label:<8}{r['wall_s']:>8.3f}{r['user_s']:>8.3f}{r['sys_s']:>7.3f}"
              f"{r['rss_mb']:>8.1f}")


PREFILTER_ONLY = r"""
import json, os, sys, time
from sattrib.engine.rules import load_rules
pf = load_rules().prefilter
files = [l for l in sys.stdin.read().split("\n") if l]
t = time.perf_counter(); hits = 0; n = 0
for p in files:
    fd = os.open(p, os.O_RDONLY)
    try:
        while True:
            b = os.read(fd, 8 << 20)
            if not b: break
            n += len(b); hits += len(pf.scan(b))
    finally:
        os.close(fd)
print(json.dumps({"scan_s": time.perf_counter() - t, "bytes": n, "literal_hits": hits,
                  "engine": pf.engine}))
"""


def measure_prefilter(py: str, files: list[Path]) -> dict:
    t = time.perf_counter()
    p = subprocess.Popen([py, "-c", PREFILTER_ONLY], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate("\n".join(map(str, files)).encode())
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"prefilter run failed: {err.decode()[-2000:]}")
    r = json.loads(out)
    r["wall_s"] = wall
    return r


PROFILE = r"""
import cProfile, pstats, sys, io, contextlib
folder, top = sys.argv[1], int(sys.argv[2])
sys.argv = ["sattrib", "analyze", folder, "--json"]
from sattrib.cli import main
pr = cProfile.Profile()
with contextlib.redirect_stdout(io.StringIO()):
    pr.enable()
    try:
        main(standalone_mode=False)
    finally:
        pr.disable()
for key in ("cumulative", "tottime"):
    print(f"---- top by {key}")
    pstats.Stats(pr).sort_stats(key).print_stats(top)
"""


def profile_sattrib(py: str, d: Path, top: int) -> str:
    r = subprocess.run([py, "-c", PROFILE, str(d), str(top)], capture_output=True, text=True)
    return r.stdout + (r.stderr[-2000:] if r.returncode else "")


def check_diagnosis(diag: dict, planted: dict | None) -> dict:
    rc = diag.get("root_cause") or {}
    got = {"outcome": diag.get("outcome"), "category": rc.get("category"),
           "node": rc.get("node"), "gpu": rc.get("gpu"), "rank": rc.get("rank"),
           "summary": rc.get("summary"), "first_seen": rc.get("first_seen")}
    if planted is None:
        return {"got": got, "ok": None, "why": "no _planted.json: nothing to compare"}
    why = []
    if got["outcome"] != "attributed":
        why.append(f"outcome {got['outcome']}")
    if got["node"] != planted["node"]:
        why.append(f"node {got['node']} != planted {planted['node']}")
    if got["category"] != planted["category"]:
        why.append(f"category {got['category']} != {planted['category']}")
    return {"got": got, "ok": not why, "why": "; ".join(why) or "matches the planted fault",
            "planted": planted}


# ----------------------------------------------------------------------------- one job


def bench_dir(d: Path, args, cmd: list[str], py: str, lits, tmp: Path, gen: dict | None) -> dict:
    files, total, rank = list_files(d)
    planted = None
    pj = d / "_planted.json"
    if pj.exists():
        planted = json.loads(pj.read_text()).get("planted")
    warm_s = warm(files)
    warm(files)
    res: dict = {"dir": str(d), "files": len(files), "bytes": total, "rank_log_bytes": rank,
                 "warm_read_s": round(warm_s, 3), "generated": gen}
    if gen:
        res.update(nodes=gen["nodes"], ranks=gen["nodes"] * gen["ranks_per_node"])
    # Side by side: each round runs sattrib, grep -E and rg once, so a burst of load from
    # elsewhere falls on all of them alike; each tool's median round is reported.
    runs: dict = {"sattrib": [], "grep_E": [], "rg": []}
    res["load_before"] = os.getloadavg()[0]
    for i in range(args.repeat):
        log(args, f"  round {i + 1}/{args.repeat}: sattrib analyze ({total / MB:,.0f} MB, "
                  f"{len(files)} files), grep -E" + (f", rg -F -j{cores()}"
                                                    if shutil.which("rg") else "") + " ...")
        runs["sattrib"].append(sattrib_once(cmd, d))
        runs["grep_E"].append(_grep_once("E", lits, d, tmp))
        if shutil.which("rg"):
            runs["rg"].append(_rg_once(lits, d, tmp))
    res["load_after"] = os.getloadavg()[0]
    s = median_run(runs["sattrib"])
    diag = s.pop("diagnosis")
    res["sattrib"] = s
    res["check"] = check_diagnosis(diag, planted)
    # Fixed cost: the same command on a folder holding only the job record (imports, rule
    # loading, prefilter compile), to separate startup from per-byte cost.
    mini = startup_folder(tmp, d / "slurm" / "job.txt")
    st = measure_sattrib(cmd, mini, max(args.repeat, 2))
    st.pop("diagnosis")
    res["sattrib_startup"] = st
    var = s["wall_s"] - st["wall_s"]
    res["sattrib"]["mb_per_s_excl_startup"] = total / MB / var if var > 0 else None
    res["grep_E"] = median_run(runs["grep_E"])
    if runs["rg"]:
        res["rg"] = median_run(runs["rg"])
    if not args.quick:
        log(args, "  grep -F ...")
        res["grep_F"] = measure_grep("F", lits, d, tmp, args.repeat)
        log(args, "  hyperscan prefilter alone ...")
        res["prefilter"] = measure_prefilter(py, files)
    for k in ("sattrib", "grep_E", "rg", "grep_F", "prefilter"):
        if k in res:
            w = res[k]["wall_s"]
            res[k]["mb_per_s"] = total / MB / w if w > 0 else None
    res["ratio_sattrib_over_grepE"] = res["sattrib"]["mb_per_s"] / res["grep_E"]["mb_per_s"]
    if "rg" in res:
        res["ratio_sattrib_over_rg"] = res["sattrib"]["mb_per_s"] / res["rg"]["mb_per_s"]
    if args.profile:
        log(args, "  profiling sattrib (cProfile) ...")
        res["profile"] = profile_sattrib(py, d, args.profile)
    return res


def log(args, msg: str) -> None:
    sys.stdout.flush()
    print(msg, file=sys.stderr, flush=True)


def fmt_row(name, r, extra=""):
    walls = r.get("walls_s") or []
    if len(walls) > 1:
        extra = f"median of {'/'.join(f'{w:.2f}' for w in walls)} s; {extra}"
    return (f"  {name:<26}{r['wall_s']:>9.2f}{r['mb_per_s']:>9.1f}"
            f"{r.get('rss_mb', float('nan')):>10.1f}{r.get('user_s', float('nan')):>8.2f}"
            f"{r.get('sys_s', float('nan')):>7.2f}  {extra}")


def print_job(res: dict, nlits: int) -> None:
    g = res.get("generated") or {}
    shape = (f"{g['nodes']} nodes x {g['ranks_per_node']} ranks x {g['mb_per_rank']} MB"
             if g else "")
    print(f"\njob {res['dir']}  {shape}")
    print(f"  {res['files']} files, {res['bytes'] / MB:,.1f} MB read "
          f"(rank logs {res['rank_log_bytes'] / MB:,.1f} MB); warm read {res['warm_read_s']:.2f} s; "
          f"load average {res['load_before']:.1f} before, {res['load_after']:.1f} after "
          f"({cores()} cores)")
    print(f"  {'tool':<26}{'wall s':>9}{'MB/s':>9}{'RSS MB':>10}{'user s':>8}{'sys s':>7}")
    print(fmt_row("sattrib analyze --json", res["sattrib"]))
    st = res["sattrib_startup"]
    print(f"  {'  of which startup':<26}{st['wall_s']:>9.2f}{'':>9}{st['rss_mb']:>10.1f}"
          f"{st['user_s']:>8.2f}{st['sys_s']:>7.2f}  (same command, folder with only "
          f"slurm/job.txt); excl. startup: {res['sattrib']['mb_per_s_excl_startup'] or 0:.1f} MB/s")
    ge = res["grep_E"]
    print(fmt_row(f"grep -E ({nlits} literals)", ge,
                  f"{ge['lines']} matching lines" + (", 2 passes (-i)" if ge["passes"] > 1
                                                     else "")))
    if "rg" in res:
        rg = res["rg"]
        print(fmt_row(f"rg -F -j{rg['threads']} (same literals)", rg,
                      f"{rg['lines']} matching lines" + (", 2 passes (-i)" if rg["passes"] > 1
                                                         else "")))
    if "grep_F" in res:
        print(fmt_row("grep -F (same literals)", res["grep_F"]))
    if "prefilter" in res:
        pf = res["prefilter"]
        print(f"  {'hyperscan prefilter only':<26}{pf['wall_s']:>9.2f}{pf['mb_per_s']:>9.1f}"
              f"{'':>10}{'':>8}{'':>7}  scan alone {pf['scan_s']:.2f} s "
              f"({pf['bytes'] / MB / pf['scan_s']:,.0f} MB/s), {pf['literal_hits']} "
              f"literal hits ({pf['engine']})")
    print(f"  throughput ratio sattrib/grep-E: {res['ratio_sattrib_over_grepE']:.2f}x "
          f"(sattrib takes {1 / res['ratio_sattrib_over_grepE']:.1f}x grep's time)")
    if "ratio_sattrib_over_rg" in res:
        print(f"  throughput ratio sattrib/rg:     {res['ratio_sattrib_over_rg']:.2f}x "
              f"(sattrib takes {1 / res['ratio_sattrib_over_rg']:.1f}x rg's time)")
    c = res["check"]
    got = c["got"]
    mark = {True: "OK", False: "WRONG", None: "?"}[c["ok"]]
    print(f"  diagnosis [{mark}]: {got['outcome']} {got['category']} node={got['node']} "
          f"gpu={got['gpu']} rank={got['rank']} first_seen={got['first_seen']}")
    print(f"    {got['summary']}")
    print(f"    {c['why']}")
    if res.get("profile"):
        print("\n" + res["profile"])


def print_sizes(rows: list[dict]) -> None:
    print("\ncost grows with the job (warm cache; MB = 10^6 bytes)")
    print(f"  {'nodes':>6}{'ranks':>7}{'MB':>9}{'gen s':>7}{'sattrib s':>10}{'MB/s':>7}"
          f"{'RSS MB':>8}{'grep-E s':>9}{'MB/s':>7}{'ratio':>7}{'rg s':>7}{'MB/s':>7}"
          f"{'ratio':>7}  diagnosis")
    for r in rows:
        if "skipped" in r:
            print(f"  {r['nodes']:>6}  skipped: {r['skipped']}")
            continue
        s, g = r["sattrib"], r["grep_E"]
        print(f"  {r['nodes']:>6}{r['ranks']:>7}{r['bytes'] / MB:>9,.0f}"
              f"{r['generated']['generate_seconds']:>7.1f}{s['wall_s']:>10.2f}"
              f"{s['mb_per_s']:>7.1f}{s['rss_mb']:>8.1f}{g['wall_s']:>9.2f}{g['mb_per_s']:>7.1f}"
              f"{r['ratio_sattrib_over_grepE']:>7.2f}"
              + (f"{r['rg']['wall_s']:>7.2f}{r['rg']['mb_per_s']:>7.1f}"
                 f"{r['ratio_sattrib_over_rg']:>7.2f}  " if "rg" in r else
                 f"{'-':>7}{'-':>7}{'-':>7}  ") +
              f"{'OK' if r['check']['ok'] else 'WRONG: ' + r['check']['why']}")


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", nargs="?", help="existing evidence folder (else one is generated)")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--mb-per-rank", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sizes", help="comma-separated node counts: generate, measure, delete each")
    ap.add_argument("--workdir", help="where generated jobs go (default: system temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep generated folders")
    ap.add_argument("--repeat", type=int, default=1,
                    help="rounds per job, each running sattrib, grep -E and rg once in turn "
                         "(each tool's median round is reported)")
    ap.add_argument("--quick", action="store_true", help="skip grep -F and prefilter-only runs")
    ap.add_argument("--profile", type=int, nargs="?", const=25, default=0, metavar="N",
                    help="also run sattrib once under cProfile and print the top N functions")
    ap.add_argument("--start", action="store_true",
                    help="only measure the start (cold and warm rule cache), best of 5")
    ap.add_argument("--sattrib", help="sattrib command (default: next to this python, or PATH)")
    ap.add_argument("--no-hyperscan", action="store_true",
                    help="run sattrib as on a machine without Hyperscan (aarch64): its "
                         "pure-Python prefilter")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    ap.add_argument("--json-out", metavar="FILE", help="also write the JSON results to FILE")
    args = ap.parse_args(argv)
    # Measure sattrib as installed: with its byte-code cached (pip compiles it at install), even
    # where the shell sets PYTHONDONTWRITEBYTECODE. This script itself writes none.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

    cmd = find_sattrib(args.sattrib)
    py = venv_python(cmd)
    if args.no_hyperscan:
        cmd = [py, "-c", NO_HYPERSCAN]
    if args.start:
        with tempfile.TemporaryDirectory(prefix="sattrib-bench-") as tmpname:
            st = measure_start(cmd, py, Path(tmpname))
        print(json.dumps(st, indent=2) if args.json else "", end="\n" if args.json else "")
        if not args.json:
            print_start(st)
        return 0
    if not shutil.which("rg"):
        log(args, RG_MISSING)
    lits = literal_keys(py)
    results = []
    with tempfile.TemporaryDirectory(prefix="sattrib-bench-") as tmpname:
        tmp = Path(tmpname)
        if args.dir:
            results.append(bench_dir(Path(args.dir), args, cmd, py, lits, tmp, None))
        else:
            sizes = ([int(x) for x in args.sizes.split(",") if x.strip()] if args.sizes
                     else [args.nodes])
            base = Path(args.workdir) if args.workdir else Path(tempfile.gettempdir())
            for n in sizes:
                need = n * args.ranks_per_node * args.mb_per_rank * MB * 1.02
                free = shutil.disk_usage(base).free
                if need > free * 0.85:
                    msg = f"needs ~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free on {base}"
                    log(args, f"{n} nodes: skipped, {msg}")
                    results.append({"nodes": n, "skipped": msg})
                    continue
                d = Path(tempfile.mkdtemp(prefix=f"job{n}-", dir=base)) / "job"
                try:
                    log(args, f"{n} nodes: generating {need / 1e9:.2f} GB into {d} ...")
                    gen = make_job.generate(str(d), n, args.ranks_per_node, args.mb_per_rank,
                                            args.seed)
                    log(args, f"  generated in {gen['generate_seconds']:.1f} s")
                    results.append(bench_dir(d, args, cmd, py, lits, tmp, gen))
                    if not args.json:
                        print_job(results[-1], len(lits))
                finally:
                    if not args.keep:
                        shutil.rmtree(d.parent, ignore_errors=True)
                    else:
                        log(args, f"  kept {d}")
    doc = {"literals": len(lits), "caseless_literals": sum(1 for _, c in lits if c),
           "cpus": os.cpu_count(), "results": results}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        if args.dir:
            print_job(results[0], len(lits))
        if len(results) > 1:
            print_sizes(results)
    return 0 if all(r.get("check", {}).get("ok") in (True, None) for r in results
                    if "skipped" not in r) else 1


if __name__ == "__main__":
    sys.exit(main())
