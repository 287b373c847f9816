"""sattrib command line. `sattrib 12345` is `sattrib show 12345`.

Imports are lazy: `sattrib <jobid>` is typed by people and must answer at once.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback
from pathlib import Path

import click

from . import __version__
from .errors import UserError

JOBID = re.compile(r"^\d+(?:[_+.]\d+)*(?:\.(?:batch|extern|interactive))?$")


class DefaultShow(click.Group):
    """A group whose first argument may be a job id: `sattrib 123` -> `sattrib show 123`."""

    def resolve_command(self, ctx, args):
        if args and JOBID.match(args[0]) and args[0] not in self.commands:
            args = ["show", *args]
        return super().resolve_command(ctx, args)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            if ctx.obj and ctx.obj.get("debug"):
                traceback.print_exc()
            from .escape import visible
            click.echo(f"sattrib: error: {visible(e.message)}", err=True)
            if e.hint:
                click.echo(f"hint: {visible(e.hint)}", err=True)
            ctx.exit(1)


def _settings(ctx, **flags):
    from .config import load
    loaded = load(flags={k: v for k, v in flags.items() if v is not None},
                  path=ctx.obj.get("config"))
    return loaded


EPILOG_MAIN = """\b
Examples:
  sattrib 4417902                 diagnosis of job 4417902 (like seff)
  sattrib analyze ./evidence      analyse an evidence folder you collected
  sattrib demo                    run the built-in demo job and store its diagnosis
  sattrib rules list              the failure patterns sattrib knows
"""


@click.group(cls=DefaultShow, epilog=EPILOG_MAIN, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sattrib")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (else $SATTRIB_CONFIG, else /etc/sattrib/sattrib.toml).")
@click.pass_context
def main(ctx, debug, config_path):
    """Slurm-native fault attribution for distributed GPU jobs.

    Finds the one GPU, link, node or rank that broke a failed job, separates it from the
    NCCL/PyTorch errors it caused on every other rank, and shows the evidence lines."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    ctx.obj["config"] = config_path
    _check_config(config_path)


def _check_config(explicit) -> None:
    """Every command stops at a broken config with the same one line (TOML syntax, unknown
    key, bad value, an explicit --config that is not there) rather than quietly reading the
    defaults. Without a config file or SATTRIB_* settings there is nothing to check, and
    `sattrib JOBID` does not pay for importing the settings model."""
    import os
    from .paths import config_path
    if explicit and not explicit.is_file():
        raise UserError(f"no config file at {explicit}",
                        "give the path of an existing file, or leave out --config to read "
                        "$SATTRIB_CONFIG or /etc/sattrib/sattrib.toml")
    if config_path(explicit).is_file() or any(
            k.startswith("SATTRIB_") and k != "SATTRIB_CONFIG" for k in os.environ):
        from .config import load
        load(path=explicit)


def _emit(d, as_json: bool):
    if as_json:
        from .escape import visible_json
        click.echo(visible_json(d.model_dump_json(indent=2)) if hasattr(d, "model_dump_json")
                   else __import__("json").dumps(d, indent=2, sort_keys=False))
    else:
        from .render import render
        click.echo(render(d.model_dump(mode="json") if hasattr(d, "model_dump") else d))


@main.command(epilog="""\b
Examples:
  sattrib analyze ./job-4417902
  sattrib analyze ./job-4417902 --json > diagnosis.json
  sattrib analyze ./job-4417902 --store --cluster alps
""")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON (the stable contract).")
@click.option("--store", is_flag=True, help="Also write the diagnosis to the database.")
@click.option("--cluster", help="Cluster name stored with the diagnosis.")
@click.option("--database", help="Database file (with --store).")
@click.option("--rules-dir", "rules_dirs", multiple=True, help="Extra rules folder (repeatable).")
@click.pass_context
def analyze(ctx, folder, as_json, store, cluster, database, rules_dirs):
    """Diagnose a failed job from an evidence folder.

    FOLDER holds slurm/ (scontrol/sacct output), logs/ (job output) and one folder per node
    (kernel log, nvidia-smi, rank output). Files are recognised by content."""
    from .analysis import (analysis_settings, analyze_folder, check_shape, load_rules,
                           reader_limits, reading_summary)
    loaded = _settings(ctx, cluster=cluster, database=database,
                       rules_dirs=list(rules_dirs) or None)
    st = loaded.settings
    if folder.is_dir() and not folder.is_symlink():
        check_shape(folder)
    rules = load_rules(st.rules_dirs)
    tty = sys.stderr.isatty()
    progress = _Progress() if tty else None
    try:
        d, bundle = analyze_folder(folder, settings=analysis_settings(st), rules=rules,
                                   limits=reader_limits(st), timezone=st.timezone,
                                   progress=progress)
    finally:
        if progress:
            progress.clear()
    if store:
        from .store import open_store
        db = open_store(st.database)
        db.upsert(d, st.cluster, bundle_path=str(folder.resolve()))
        db.sync_rules(rules)
    _emit(d, as_json)
    if not as_json:
        click.echo(reading_summary(bundle))
    elif tty:
        click.echo(reading_summary(bundle), err=True)


class _Progress:
    """Files and bytes read so far, on one line of a terminal's stderr: shown once an analysis
    has run for a second, redrawn at most four times a second, erased at the end."""

    def __init__(self, after: float = 1.0):
        self.t0 = time.monotonic()
        self.after, self.last, self.shown = after, 0.0, False

    def __call__(self, files: int, of_files: int, done: int, of_bytes: int) -> None:
        now = time.monotonic()
        if now - self.t0 < self.after or now - self.last < 0.25:
            return
        self.last, self.shown = now, True
        sys.stderr.write(f"\r\x1b[Ksattrib: read {files}/{of_files} files, "
                         f"{done / 1e6:,.0f}/{of_bytes / 1e6:,.0f} MB")
        sys.stderr.flush()

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@main.command(epilog="""\b
Examples:
  sattrib show 4417902
  sattrib 4417902 --json
  sattrib 4417902.batch          (a step id as sacct prints it)
  sattrib 4417902 --restart 1
  sattrib 4417902 --all --json   (every run of a requeued job, as an array)
  SATTRIB_SERVER_URL=https://slurmctl.example.org/sattrib/ sattrib 4417902
                                 (on a login node: ask the controller's dashboard)
""")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON (one object).")
@click.option("--cluster", help="Only this cluster's diagnosis.")
@click.option("--restart", type=int, help="Which run of a requeued job (default: the last).")
@click.option("--all", "all_runs", is_flag=True,
              help="Every run of a requeued job (with --json: an array).")
@click.option("--database", help="Database file.")
@click.pass_context
def show(ctx, job_id, as_json, cluster, restart, all_runs, database):
    """Show the stored diagnosis of a job (what `sattrib JOBID` runs): its last run, or the
    one --restart names.

    Where the diagnoses database cannot be read (a login node has none) or does not know the
    job, and `server_url` is set (/etc/sattrib/sattrib.toml or SATTRIB_SERVER_URL), the
    controller's dashboard answers (after the user's own bundle, when readable), shown the
    same way; its evidence lines only if the dashboard shows them to everyone, or to you for
    your own job (a MUNGE credential says who asks)."""
    job_id, rows, dashboard = _runs(ctx, job_id, cluster, restart, database)
    shown = rows if all_runs else rows[-1:]
    if dashboard:
        for r in shown:
            r.update(dashboard.diagnosis(job_id, r))
        if dashboard.no_munge and any(r.get("withheld") for r in shown):
            click.echo(f"sattrib: note: no MUNGE credential ({dashboard.no_munge}): the "
                       "dashboard shows your own job's evidence lines only to a caller it "
                       "knows", err=True)
    if as_json:
        import json
        # What was done about it (drain, requeue, notifications, a repeat-offender
        # escalation, the cross-job incident it is part of) is recorded beside the diagnosis:
        # added as fields, never changed in it; so is the dashboard's word that it left out
        # the evidence lines.
        docs = [dict(r["diagnosis"], actions=r.get("actions") or [],
                     escalation=r.get("escalation"), incident=r.get("incident"),
                     **({"evidence_text": "withheld"} if r.get("withheld") else {}))
                for r in shown]
        click.echo(json.dumps(docs if all_runs else docs[0], indent=2))
        return
    from .render import render
    for i, r in enumerate(shown):
        if i:
            click.echo()
        n = rows.index(r) + 1
        click.echo(render(r["diagnosis"], cluster=r["cluster"],
                          run=(n, len(rows)) if len(rows) > 1 else None,
                          acted={"actions": r.get("actions") or [],
                                 "escalation": r.get("escalation"),
                                 "incident": r.get("incident")}))
    if len(rows) > 1 and not all_runs:
        click.echo(f"(job {job_id} ran {len(rows)} times; --all shows every run, --restart N "
                   "one of them)", err=True)


def _runs(ctx, job_id: str, cluster, restart, database) -> tuple[str, list, object]:
    """(the job id, its stored runs in order, the dashboard that answered or None): from the
    database, else the user's own bundle, else the controller's dashboard (`server_url`)."""
    import os
    import re
    from . import paths
    from .lookup import connect_readonly, find, missing, readable
    m = re.fullmatch(r"(\d+(?:_\d+)?)(?:\.(?:batch|extern|interactive|\d+))?", job_id.strip())
    if not m:
        raise UserError(f"not a job id: {job_id!r}",
                        "give a Slurm job id, e.g. 4417902, 4417902_3 or 4417902.batch")
    job_id = m.group(1)                       # a step id pasted from sacct: its job
    db_path = Path(os.path.expanduser(paths.database(database, ctx.obj.get("config"))))
    # A login node has no database: the controller's dashboard answers (an explicit
    # --database is always read locally).
    server = None if database else paths.setting("server_url", None, ctx.obj.get("config"))
    rows, where, dashboard = [], db_path, None
    if not server and not database and missing(db_path):
        raise UserError(f"no diagnoses database at {db_path}",
                        "on a login node, set server_url in /etc/sattrib/sattrib.toml to the "
                        "controller's dashboard; elsewhere run `sattrib demo` or set `database`")
    if readable(db_path) and not (server and missing(db_path)):
        rows = find(connect_readonly(db_path), db_path, job_id, cluster, restart)
    else:
        # The user's own bundle (exported to login nodes) has the evidence lines: first.
        rows = _own_bundles(ctx, db_path, job_id, cluster, restart, or_none=bool(server))
    if not rows and server:
        from .remote import Dashboard
        st = _settings(ctx).settings
        dashboard = Dashboard(st.server_url, st.server_timeout_s, st.server_ca_file,
                              st.munge_socket)
        if dashboard.warning():
            click.echo(dashboard.warning(), err=True)
        rows, where = dashboard.runs(job_id, cluster, restart), st.server_url
    if not rows:
        raise UserError(f"no diagnosis for job {job_id} in {where}",
                        f"run `sattrib collect {job_id}` on the controller, or "
                        "`sattrib analyze DIR --store` on an evidence folder")
    clusters = sorted({r["cluster"] for r in rows})
    if len(clusters) > 1:
        raise UserError(f"job {job_id} is known to clusters {', '.join(clusters)}",
                        f"pick one: sattrib {job_id} --cluster {clusters[0]}")
    rows.sort(key=lambda r: r["restart"])
    return job_id, rows, dashboard



@main.command(epilog="""\b
Exit status (one per blame, for job scripts and retry wrappers):
  10 machine            a GPU, link, port or node failed: resubmit, avoiding the culprit
  11 site_environment   a shared filesystem or network setting: resubmit once it is fixed
  12 scheduler          time limit, preemption or scancel
  13 workload           the job's own error: fix it before resubmitting
  14 unknown            nothing proven, or causes that disagree
   1                    no diagnosis (or another error)
\b
Examples:
  sattrib verdict 4417902
  sattrib verdict 4417902 --json      (blame, status, the node to exclude, time lost)
  sattrib verdict "$SLURM_JOB_ID"; [ $? -eq 10 ] && sbatch --exclude=... job.sh
""")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.option("--cluster", help="Only this cluster's diagnosis.")
@click.option("--restart", type=int, help="Which run of a requeued job (default: the last).")
@click.option("--database", help="Database file.")
@click.pass_context
def verdict(ctx, job_id, as_json, cluster, restart, database):
    """Whose fault a failed job was, in one sentence, and as the exit status: was it your
    code, can you resubmit and which node to avoid, how much time was lost."""
    from . import verdict as v
    job_id, rows, dashboard = _runs(ctx, job_id, cluster, restart, database)
    r = rows[-1]
    if dashboard:
        r.update(dashboard.diagnosis(job_id, r))
    d, acted = r["diagnosis"], {"actions": r.get("actions") or []}
    blame = v.job_blame(d)
    if as_json:
        import json
        click.echo(json.dumps({
            "job_id": job_id, "restart": r["restart"], "blame": blame, "status": v.EXIT[blame],
            "exclude": v.exclude(d),
            "lost_s": v.lost_seconds(d), "verdict": v.sentence(d, acted)}, indent=2))
    else:
        from .escape import visible
        click.echo("\n".join(visible(ln) for ln in v.lines(d, acted)))
    ctx.exit(v.EXIT[blame])

@main.command("list", epilog="""\b
Examples:
  sattrib list                              failed jobs that ended since midnight
  sattrib list -S 7d --infra                the machine's faults of the last week
  sattrib list -S 2026-11-01 --node gpu-a017
  sattrib list --category nvlink --json
""")
@click.option("-S", "--since", default="today", show_default=True,
              help="Jobs that ended since: today, yesterday, 7d, 12h, or a local date/time.")
@click.option("-E", "--until", help="...and before this (same forms).")
@click.option("--user", "-u", help="Only this user's jobs.")
@click.option("--partition", "-p", help="Only this partition.")
@click.option("--category", help="Only this root-cause category.")
@click.option("--node", "-n", help="Jobs that ran on this node or name it as the culprit.")
@click.option("--outcome", type=click.Choice(["attributed", "ambiguous", "unattributed"]))
@click.option("--state", "-s", help="Only this final job state (FAILED, TIMEOUT, NODE_FAIL...).")
@click.option("--infra", is_flag=True,
              help="Only the machine's faults (GPU, NVLink, network port, the node's own disk "
                   "or driver, node failure) on evidence the job did not write.")
@click.option("--cluster", help="Only this cluster.")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--parsable", "-P", is_flag=True, help="Rows separated by '|', as sacct -P.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON array.")
@click.option("--database", help="Database file.")
@click.pass_context
def list_cmd(ctx, since, until, user, partition, category, node, outcome, state, infra,
             cluster, limit, parsable, as_json, database):
    """Diagnosed failures, newest first, like `sacct -S today --state=FAILED` (admins)."""
    from .lookup import list_failures, parse_since
    if category:
        _check_category(category)
    conn, db_path = _admin_db(ctx, database, "the list")
    since, until = parse_since(since), parse_since(until) if until else None
    rows = list_failures(conn, db_path, since, until, cluster=cluster, user=user,
                         partition=partition, category=category, node=node, outcome=outcome,
                         state=state, infra=infra, limit=limit)
    if as_json:
        import json
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no diagnosed failures of jobs that ended since {since}"
                   + (f" until {until}" if until else ""), err=True)
        return
    table = [("ENDED (UTC)", "JOBID", "USER", "PARTITION", "STATE", "OUTCOME", "CATEGORY",
              "CULPRIT", "ACTION")]
    for r in rows:
        culprit = "/".join(str(x) for x in (r["culprit_node"], r["culprit_gpu"]) if x) or "-"
        if r["culprit_rank"] is not None:
            culprit += f" rank {r['culprit_rank']}"
        job = f"{r['job_id']}" + (f".{r['restart']}" if r["restart"] else "")
        table.append(((r["ended"] or "")[:19].replace("T", " "), job, r["user"] or "-",
                      r["partition"] or "-", r["job_state"] or "-", r["outcome"],
                      r["category"] or "-", culprit, r["action_code"] or "-"))
    _table(table, parsable)


def _check_category(category: str) -> None:
    """A typo'd category is one line naming the valid ones, not an empty list."""
    import difflib
    from .engine.taxonomy import Category
    known = [c.value for c in Category]
    if category not in known:
        near = difflib.get_close_matches(category.replace("-", "_").lower(), known, 1)
        raise UserError(f"unknown category {category!r}",
                        (f"did you mean {near[0]}? " if near else "") + "one of: "
                        + ", ".join(known))


def _admin_db(ctx, database, what: str):
    """(connection, path) of the database for an admin's command; one line for anyone else."""
    import os
    from . import paths
    from .lookup import connect_readonly, readable
    db_path = Path(os.path.expanduser(paths.database(database, ctx.obj.get("config"))))
    if not readable(db_path):
        raise UserError(f"cannot read {db_path}: {what} is for admins (root and SlurmUser's "
                        "group)", "`sattrib JOBID` shows your own jobs")
    return connect_readonly(db_path), db_path


def _table(table: list, parsable: bool) -> None:
    """Columns as text (cells escaped: users named their jobs and partitions), or with -P
    '|'-separated, each cell also kept from reading as a spreadsheet formula."""
    from .escape import spreadsheet_cell, visible
    table = [[visible(c) for c in row] for row in table]
    if parsable:
        for row in table:
            click.echo("|".join(spreadsheet_cell(c.replace("|", "/")) for c in row))
        return
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


@main.command(epilog="""\b
Examples:
  sattrib hotspots                 nodes with the most machine faults, jobs ended in 30 days
  sattrib hotspots --gpu -S 90d    GPUs (node + PCI address), last 90 days
""")
@click.option("-S", "--since", default="30d", show_default=True,
              help="Jobs that ended since: today, 7d, 30d, or a local date/time.")
@click.option("--gpu", is_flag=True, help="Rank GPUs instead of nodes.")
@click.option("--cluster", help="Only this cluster.")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--parsable", "-P", is_flag=True, help="Rows separated by '|'.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as a JSON array.")
@click.option("--database", help="Database file.")
@click.pass_context
def hotspots(ctx, since, gpu, cluster, limit, parsable, as_json, database):
    """Nodes (or GPUs) named most often as the culprit of the machine's fault, on evidence the
    job did not write; a user's exception, OOM or own libraries, a shared filesystem, or a
    hardware line only the job printed is never counted as the node's (admins)."""
    from .lookup import hotspot_rows, parse_since
    conn, db_path = _admin_db(ctx, database, "the hotspot list")
    since = parse_since(since)
    rows = hotspot_rows(conn, db_path, since, gpu, cluster, limit)
    if as_json:
        import json
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no machine faults in jobs that ended since {since}", err=True)
        return
    head = ("NODE", "GPU", "FAILURES", "CATEGORIES", "LAST ENDED (UTC)") if gpu else \
        ("NODE", "FAILURES", "GPUS", "CATEGORIES", "LAST ENDED (UTC)")
    table = [head]
    for r in rows:
        last = (r["last"] or "")[:19].replace("T", " ")
        table.append((r["node"], r["gpu"], str(r["failures"]), r["categories"], last) if gpu
                     else (r["node"], str(r["failures"]), str(r["gpus"]), r["categories"], last))
    _table(table, parsable)


@main.command("incidents", epilog="""\b
Examples:
  sattrib incidents                  incidents whose last failure was in the last 7 days
  sattrib incidents -S today --json
  sattrib incidents 3                one incident: the element, its jobs, those that ran on
  sattrib incidents 3 --json         ... as a diagnosis with evidence
""")
@click.argument("number", type=int, required=False)
@click.option("-S", "--since", default="7d", show_default=True,
              help="Incidents whose last failure is at or after this (today, 7d, a date).")
@click.option("--cluster", help="Only this cluster.")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--parsable", "-P", is_flag=True, help="Rows separated by '|'.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows (or the incident) as JSON.")
@click.option("--database", help="Database file.")
@click.pass_context
def incidents_cmd(ctx, number, since, cluster, limit, parsable, as_json, database):
    """Cross-job incidents, newest first (admins): one switch, rack, PDU, chassis, NVLink
    domain or file system behind the failures of several jobs (README "Incidents")."""
    import json
    from .incidents import document, listing
    from .lookup import parse_since
    conn, db_path = _admin_db(ctx, database, "the incident list")
    if number is not None:
        doc = document(conn, number)
        if doc is None:
            raise UserError(f"no incident {number} in {db_path}", "`sattrib incidents` lists them")
        click.echo(json.dumps(doc, indent=2) if as_json else _incident_text(doc))
        return
    rows = listing(conn, parse_since(since), cluster, limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no incidents since {parse_since(since)}", err=True)
        return
    table = [("ID", "STATUS", "CLUSTER", "ELEMENT", "JOBS", "NODES", "RAN ON", "FIRST (UTC)",
              "LAST (UTC)", "NOTIFIED")]
    for r in rows:
        table.append((str(r["id"]), r["status"], r["cluster"], f"{r['kind']} {r['element']}",
                      str(r["jobs"]), r["failed_nodes"] or "-", str(r["ran_on"]),
                      r["first_failure_at"][:19].replace("T", " "),
                      r["last_failure_at"][:19].replace("T", " "), r["notification"] or "-"))
    _table(table, parsable)


def _incident_text(doc: dict) -> str:
    """One incident for a terminal (every field escaped: the site and Slurm wrote them)."""
    from .escape import visible_all
    d = visible_all(doc)
    out = [f"Incident {d['id']} ({d['status']}) on {d['cluster']}: {d['summary']}",
           f"Element: {d['kind']} {d['element']}"
           + (f" = {d['element_nodes']}" if d["element_nodes"] else "")
           + f" ({d['declared']['source']}: {d['declared']['text']})",
           f"Failed: {d['jobs']} jobs on {d['failed_nodes']} ({d['category']}), "
           f"{d['first_failure_at']} .. {d['last_failure_at']}"]
    out += [f"  job {j['job_id']}" + (f".{j['restart']}" if j["restart"] else "")
            + f" on {j['nodes']}: {j['category'] or j['outcome']}  {j['failed_at']}"
            for j in d["failed_jobs"][:20]]
    if len(d["failed_jobs"]) > 20:
        out.append(f"  ... {len(d['failed_jobs']) - 20} more (--json shows all)")
    out.append("Ran on behind it: " + ("; ".join(f"job {j['job_id']} ({j['state']}) on "
                                                  f"{j['nodes']}" for j in d["ran_on"][:20])
                                        or "none"))
    out += [f"Weighed: {c['element']}: {c['why']}" for c in d["considered"]]
    out.append(f"Action: {d['action']}")
    n = d["notification"]
    out.append(f"Notified: {n['decision'] or 'no'}" + (f" ({n['detail']})" if n["detail"] else ""))
    return "\n".join(out)


@main.command(epilog="""\b
Examples:
  sattrib resume gpu-a017          back to service, if sattrib drained it
""")
@click.argument("node")
@click.pass_context
def resume(ctx, node):
    """Return a node sattrib drained to service (scontrol update State=RESUME). A node whose
    reason does not start with `sattrib:` was drained by someone else: it is left alone. The
    resume is recorded in the database (when this user may write it): the node leaves the
    dashboard's drain list."""
    from .actions import resume as do_resume
    from .escape import visible
    from .store import open_store
    st = _settings(ctx).settings
    db = open_store(st.database) if os.access(st.database, os.W_OK) else None
    click.echo(visible(do_resume(node, st.action_timeout_s, db)))     # quotes Slurm's reason


def _own_bundles(ctx, db_path: Path, job_id: str, cluster, restart,
                 or_none: bool = False) -> list:
    """For a user who may not read the database: their own job's bundle, or one clear line.
    `or_none` (the dashboard answers next): none is no error, and slurmctld is not asked for
    the cluster's name."""
    import os
    import time
    from . import paths
    from .lookup import find_in_bundles
    config = ctx.obj.get("config")
    bundles = Path(os.path.expanduser(paths.bundle_dir(config)))
    clusters = [cluster] if cluster else [paths.setting("cluster", None, config) or "default"]
    rows = find_in_bundles(bundles, clusters, job_id, restart)
    if not rows and not cluster and not or_none:
        from .collectors.slurm_job import cluster_name
        name = cluster_name(time.monotonic() + 5)      # the name the hooks file runs under
        if name and name not in clusters:
            rows = find_in_bundles(bundles, [name], job_id, restart)
    if rows or or_none:
        return rows
    try:
        import grp
        group = grp.getgrgid(os.stat(db_path).st_gid).gr_name
    except (KeyError, OSError):
        group = "the database's group"
    raise UserError(f"no diagnosis of job {job_id} that you may read: the database {db_path} "
                    f"is readable by root and group {group} only, and {bundles} holds no "
                    f"bundle of yours for this job",
                    "users see the diagnoses of their own jobs; for another user's job ask an "
                    f"admin (root or a member of {group}); add --cluster NAME if it ran on "
                    "another cluster")


@main.command(epilog="""\b
Examples:
  sattrib collect 4417902                  on the controller, within MinJobAge of the job's end
  sattrib collect 4417902 --force --wait 0 diagnose even a job that looks clean, no waiting
""")
@click.argument("job_id")
@click.option("--restart", type=int, help="Which run of a requeued job (default: the last).")
@click.option("--force", is_flag=True, help="Diagnose even if the job looks successful.")
@click.option("--wait", "wait_s", type=float, help="Seconds to wait for node snapshots.")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON.")
@click.pass_context
def collect(ctx, job_id, restart, force, wait_s, as_json):
    """Diagnose a finished job by hand, as the EpilogSlurmctld worker does.

    Reads scheduler state, the node snapshots in the spool and the job's output, builds the
    evidence bundle, stores the diagnosis and prints it."""
    from .collect import collect_job
    from .incidents import settle
    from .store import open_store
    st = _settings(ctx).settings
    out = collect_job(job_id, st, restart=restart, force=force, wait_snapshots=wait_s)
    if not out.diagnosed:
        raise UserError(out.message, "use --force to diagnose it anyway")
    # By hand there is no queue to wait for: what waited for it is decided now.
    d = out.diagnosis
    settle(open_store(st.database), st, only=f"{out.bundle.parent.name}/{d.job_id}/{d.restart}")
    _emit(out.diagnosis, as_json)
    if not as_json:
        click.echo(click.style(f"bundle {out.bundle}", dim=True))


@main.command("queue", epilog="""\b
Examples:
  sattrib queue              jobs waiting for a worker, being diagnosed, set aside
  sattrib queue --run        work through the queue here (after a controller restart)
  sattrib queue --retry      put the set-aside jobs back in the queue
""")
@click.option("--run", "run_now", is_flag=True,
              help="Work through the queue in this process, within worker_concurrency (as "
                   "the queue's owner, SlurmUser).")
@click.option("--retry", is_flag=True, help="Put the jobs set aside in failed/ back in the queue.")
@click.option("--limit", type=int, default=20, show_default=True,
              help="Entries shown per state (the oldest).")
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
@click.pass_context
def queue_cmd(ctx, run_now, retry, limit, as_json):
    """The controller's job queue (admins): the jobs EpilogSlurmctld handed over that wait for
    a worker (pending), that a worker is diagnosing (claimed), and that were set aside after
    queue_max_attempts failed attempts (failed), with why."""
    from .jobqueue import Queue, QueueError, queue_dir
    st = _settings(ctx).settings
    root = queue_dir(st.database)
    try:
        q = Queue(root, create=False)
        if (run_now or retry) and not q.owned():
            import pwd
            owner = pwd.getpwuid(root.lstat().st_uid).pw_name
            raise UserError(f"the queue {root} is {owner}'s: only its owner runs its jobs",
                            f"sudo -u {owner} sattrib queue {'--run' if run_now else '--retry'}")
        if retry:
            click.echo(f"{q.retry_failed()} set-aside jobs queued again", err=True)
        if run_now:
            _run_queue(q, st)
        listing = q.listing(limit)
        busy = q.busy_slots()
    except QueueError as e:
        raise UserError(f"no usable queue: {e}", "EpilogSlurmctld makes it beside the database "
                        "when the first job ends") from None
    except PermissionError as e:
        raise UserError(f"cannot read the queue {root}: {e.strerror}",
                        "the queue is for admins (root and SlurmUser)") from None
    if as_json:
        import json
        click.echo(json.dumps({"queue": str(root), "workers": busy,
                               "worker_concurrency": st.worker_concurrency, **listing},
                              indent=2))
        return
    counts = ", ".join(f"{listing[s]['count']} {s}" for s in listing)
    click.echo(f"queue {root}: {counts}; {busy} of {st.worker_concurrency} workers running")
    table = [("STATE", "JOB", "RUN", "QUEUED (UTC)", "TRIES", "NOTE")]
    for state, got in listing.items():
        for e in got["entries"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e["queued_at"])) \
                if isinstance(e["queued_at"], (int, float)) else "?"
            note = e.get("worker") or e["why"] or ""
            table.append((state, str(e["job_id"] or e["name"]), str(e["restart"] or 0), when,
                          str(e["attempts"]), note))
    if len(table) > 1:
        _table(table, False)


def _run_queue(q, st) -> None:
    """`sattrib queue --run`: a worker in this process, in a free slot."""
    import logging
    from .worker import work
    slot = q.slot(st.worker_concurrency)
    if slot is None:
        click.echo(f"{st.worker_concurrency} workers are running: they empty the queue", err=True)
        return
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s sattrib-worker[%(process)d] %(message)s")
    click.echo(f"{work(q, st, slot)} queued jobs taken", err=True)


@main.command(epilog="""\b
Examples:
  sattrib serve                                  http://127.0.0.1:8001/
  sattrib serve --host 0.0.0.0 --port 8080
  SATTRIB_SERVE_BASE_URL=/sattrib/ sattrib serve behind a reverse proxy at /sattrib/
  sattrib serve --root                           prints a login URL for the admin "root"
""")
@click.option("--host", help="Address to bind (serve_host).")
@click.option("--port", type=int, help="Port (serve_port).")
@click.option("--base-url", help="Path prefix when behind a reverse proxy (serve_base_url).")
@click.option("--database", help="Database file.")
@click.option("--root", "root", is_flag=True,
              help="Print a one-time URL that logs in as the admin actor \"root\".")
@click.option("--print-command", is_flag=True, help="Print the Datasette command, do not run it.")
@click.pass_context
def serve(ctx, host, port, base_url, database, root, print_command):
    """Start the read-only dashboard (Datasette) on the diagnoses database.

    Recent failures, failures by category over time, node and GPU hotspots, unexplained
    failures and missing telemetry, and one page per diagnosis with its timeline. Evidence
    lines are shown to admins only (serve_evidence_text, serve_admins)."""
    from .serve import prepare, serve as run_serve, warnings
    st = _settings(ctx, serve_host=host, serve_port=port, serve_base_url=base_url,
                   database=database).settings
    for warning in warnings(st):
        click.echo(warning, err=True)
    if print_command:
        import shlex
        click.echo(shlex.join(prepare(st, root)[0]))
        return
    from .mounts import network_fs_warning
    warning = network_fs_warning(st.database)
    if warning:
        click.echo(warning, err=True)
    run_serve(st, root)


@main.group()
def rules():
    """List and test failure rules (built-in and site rules)."""


@rules.command("list", epilog="""\b
Examples:
  sattrib rules list
  sattrib rules list --json | jq '.[].id'
""")
@click.option("--json", "as_json", is_flag=True)
@click.option("--rules-dir", "rules_dirs", multiple=True, help="Extra rules folder.")
@click.pass_context
def rules_list(ctx, as_json, rules_dirs):
    """List every loaded rule: id, role, category, source and title."""
    from .analysis import load_rules
    st = _settings(ctx.find_root(), rules_dirs=list(rules_dirs) or None).settings
    rs = load_rules(st.rules_dirs)
    if as_json:
        import json
        click.echo(json.dumps([{"id": c.rule.id, "title": c.rule.title, "role": c.rule.role.value,
                                "category": c.rule.category.value if c.rule.category else None,
                                "source": [s.value for s in c.rule.source], "file": c.path}
                               for c in rs.rules], indent=2))
        return
    for c in rs.rules:
        cat = c.rule.category.value if c.rule.category else "-"
        src = ",".join(s.value for s in c.rule.source)
        click.echo(f"{c.rule.id:32} {c.rule.role.value:12} {cat:22} {src:16} {c.rule.title}")
    click.echo(f"{len(rs)} rules, version {rs.version}")


@rules.command("sources", epilog="""\b
Examples:
  sattrib rules sources                       every catalog row and the file that prints it
  sattrib rules sources --emitter NVIDIA/nccl
  sattrib rules sources --emitter NVIDIA/nccl --src ~/src/nccl   and the source lines
""")
@click.option("--emitter", help="Only rows read from this repository (owner/name).")
@click.option("--src", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A clone (or bare git folder) of the emitter: show the lines that print each row.")
@click.option("--rules-dir", "rules_dirs", multiple=True, help="Extra rules folder.")
@click.pass_context
def rules_sources(ctx, emitter, src, rules_dirs):
    """Where each message-catalog row came from: emitter file, version, and its pattern."""
    from .analysis import load_rules
    from .engine.matcher import required_literals
    st = _settings(ctx.find_root(), rules_dirs=list(rules_dirs) or None).settings
    rs = load_rules(st.rules_dirs)
    rows = sorted((r for c in rs.rules for r in c.rows), key=lambda r: r.where)
    if emitter:
        rows = [r for r in rows if r.emitter.split()[0] == emitter]
    for r in rows:
        cat = r.category.value if r.category else "-"
        role = "teardown" if r.teardown else r.role.value
        click.echo(f"{r.where:28} {r.rule:22} {role:12} {cat:20} {r.emitter} @ {r.version}")
        click.echo(f"{'':28} match: {r.match}")
        if src:
            try:
                lits = required_literals(r.match)
            except ValueError:
                lits = []
            # The source holds a format string: try the longest literal, then shorter runs of
            # its leading words, until the file shows the line that prints it.
            words = max(lits, key=len).split() if lits else []
            for n in range(len(words), 1, -1):
                hits = _grep_source(src, " ".join(words[:n]), r.emitter.split(" ", 1)[-1],
                                    r.version)
                if hits:
                    for hit in hits[:3]:
                        click.echo(f"{'':28} source: {hit}")
                    break
    click.echo(f"{len(rows)} catalog rows")


def _grep_source(src: Path, literal: str, path: str, version: str) -> list[str]:
    """file:line: text of the emitter's lines holding the literal: in a git folder at the row's
    version (tag) in its file, else anywhere at HEAD; in a plain tree, in its file."""
    import subprocess

    def run(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
    if (src / "HEAD").is_file() or (src / ".git").exists():
        git = ["git", "-C", str(src)]
        out = ""
        if run(git + ["rev-parse", "-q", "--verify", f"{version}^{{commit}}"]).strip():
            out = run(git + ["grep", "-n", "-F", "-e", literal, version, "--", path])
        out = out or run(git + ["grep", "-n", "-F", "-e", literal, "HEAD"])
    else:
        out = run(["grep", "-rnF", "-e", literal, str(src / path)])
    return [ln.strip()[:200] for ln in out.splitlines()]


@rules.command("test", epilog="""\b
Examples:
  sattrib rules test                      the built-in rules
  sattrib rules test /etc/sattrib/rules.d a site's own rules
""")
@click.argument("path", required=False, type=click.Path(path_type=Path))
def rules_test(path):
    """Validate rule files and message catalogs and run their examples."""
    from .engine.rules import (BUILTIN_DIR, RuleError, check_catalog_examples, check_dir,
                               load_rules)
    root = path or BUILTIN_DIR
    if not root.is_dir():
        raise UserError(f"no such rules folder: {root}",
                        "rules live in <domain>/<mechanism>.yaml under that folder")
    n, errors = check_dir(root)
    rows = 0
    if not errors:
        try:
            rs = load_rules([root] if path else [])
            rows = sum(len(c.rows) for c in rs.rules)
            errors = check_catalog_examples(rs, f"{root}/" if path else "catalogs/")
        except RuleError as e:
            errors = [str(e)]
    for e in errors:
        click.echo(f"FAIL {e}")
    click.echo(f"{n} rule files and {rows} catalog rows checked, {len(errors)} problems")
    if errors:
        sys.exit(1)


@main.command(epilog="""\b
Examples:
  sattrib demo
  sattrib demo --json
  sattrib demo --keep ./demo-evidence      also keep the evidence folder to look at
""")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis JSON.")
@click.option("--keep", type=click.Path(path_type=Path), help="Write the evidence folder here.")
@click.option("--no-store", is_flag=True, help="Do not write to the database.")
@click.option("--database", help="Database file.")
@click.pass_context
def demo(ctx, as_json, keep, no_store, database):
    """Diagnose the built-in demo job: 4 nodes, three different NCCL errors, one NVLink fault.

    Writes the evidence folder, analyses it, stores the diagnosis (so `sattrib 1001` shows it)
    and prints it."""
    import tempfile
    from datetime import datetime, timezone
    from .analysis import analysis_settings, analyze_folder, load_rules, reader_limits
    from .demo import JOB_ID, write_demo
    st = _settings(ctx, database=database).settings
    rules = load_rules()
    with tempfile.TemporaryDirectory(prefix="sattrib-demo-") as tmp:
        # The job ends now: `sattrib list` (jobs that ended today) shows it at once.
        folder = write_demo(keep or Path(tmp) / f"job-{JOB_ID}", end=datetime.now(timezone.utc))
        d, _ = analyze_folder(folder, settings=analysis_settings(st), rules=rules,
                              limits=reader_limits(st))
    if not no_store:
        from .store import open_store
        db = open_store(st.database)
        db.upsert(d, st.cluster, bundle_path=str(keep.resolve()) if keep else None)
        db.sync_rules(rules)
    _emit(d, as_json)
    if not as_json and not no_store:
        click.echo(click.style(f"stored in {st.database}; see it again with `sattrib {JOB_ID}`",
                               dim=True))


@main.command("config", epilog="""\b
Examples:
  sattrib config
  SATTRIB_DATABASE=/tmp/d.db sattrib config
""")
@click.pass_context
def config_cmd(ctx):
    """Print every setting, its effective value and where it came from."""
    from .mounts import network_fs_warning
    loaded = _settings(ctx)
    click.echo(f"# config file: {loaded.path or '(none)'}")
    warning = network_fs_warning(loaded.settings.database)
    if warning:
        click.echo(f"# {warning}")
    for k, v in loaded.settings.model_dump().items():
        click.echo(f"{k} = {v!r}    # {loaded.sources[k]}")


def run():  # pragma: no cover - console entry point wrapper
    main(prog_name="sattrib")
