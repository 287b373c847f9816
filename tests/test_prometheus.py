"""Metrics as evidence: the Prometheus connector against a real Prometheus (Debian's package,
started here on a free loopback port with recorded exporter series backfilled into its TSDB),
the bundle's `<node>/metrics.json`, and the diagnosis the rules in engine/rules/metrics/ give
from it. Also the pure half (counter resets, a stale Xid, batching) without any server."""
import json
import logging
import os
import time
from pathlib import Path

import pytest

from prometheus_server import (Answers, Answers500, NeverAnswers, Prometheus, Trickles,
                               closed_port_url, exposition, have_prometheus, openmetrics,
                               self_signed_ca, steps, token_file)
from sattrib.analysis import analyze_folder
from sattrib.collectors import prometheus
from sattrib.config import Settings

# The job ran [START, END]; the fault came at FAIL. Recent times: the worker test below runs
# the real controller code path, which takes the job's times from (recorded) scontrol text.
END = float(int(time.time()) // 60 * 60 - 120)
START = END - 1200
FAIL = END - 300
LO, HI = START - 900, END + 400        # what the recorded exporters sampled
TOKEN = "s3cr3t-bearer-7f1c2a9e"


def _samples():
    x = exposition()
    up_at = lambda before, after: (lambda t: before if t < FAIL else after)  # noqa: E731
    s = []
    # Xid 79 seen only by dcgm-exporter: the node died, its journal is gone.
    s.append((x["DCGM_FI_DEV_XID_ERRORS"], "gn-xid", steps(LO, HI, up_at(0, 79))))
    s.append((x["xid79"], "gn-xid", steps(FAIL, HI, lambda t: 79)))
    # Double-bit ECC errors during the job.
    s.append((x["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], "gn-ecc", steps(LO, HI, up_at(0, 2))))
    # One IB link went down on one node.
    s.append((x["node_infiniband_link_downed_total"], "gn-ib", steps(LO, HI, up_at(3, 4))))
    # k2 (the worker test): Xid 79, no snapshot.
    s.append((x["DCGM_FI_DEV_XID_ERRORS"], "k2", steps(LO, HI, up_at(0, 79))))
    # A counter reset (driver reload: volatile ECC counts start again at 0) and an Xid left
    # from an earlier job: neither is this job's fault.
    s.append((x["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"], "gn-reset", steps(LO, HI, up_at(5, 0))))
    s.append((x["DCGM_FI_DEV_XID_ERRORS"], "gn-reset", steps(LO, HI, lambda t: 79)))
    # dcgm-exporter's newer Xid series (labelled err_code) alone: born with the Xid, inside
    # the job's window, while the node's other series run from before the job.
    s.append((x["xid79"], "gn-born", steps(FAIL, HI, lambda t: 79)))
    for node in ("gn-xid", "gn-ecc", "gn-ib", "gn-reset", "k1", "k2", "gn-born"):
        s.append((x["DCGM_FI_DEV_GPU_TEMP"], node, steps(LO, HI, lambda t: 64)))
        s.append((x["node_infiniband_state_id"], node, steps(LO, HI, lambda t: 4)))
    # The hang picture: every GPU of gn-h1..3 falls idle together at OTHERS, except gn-h2's
    # GPU 2 which fell at FIRST; in gn-m1..3 two GPUs on two nodes fell first, 10 s apart (less
    # than the 15 s sampling step: which was first cannot be told).
    for node in ("gn-h1", "gn-h2", "gn-h3", "gn-m1", "gn-m2", "gn-m3"):
        for gpu in range(4):
            fell = {("gn-h2", 2): FIRST, ("gn-m1", 1): FIRST, ("gn-m3", 0): FIRST + 10}.get(
                (node, gpu), OTHERS)
            s.append((_gpu(x["DCGM_FI_DEV_GPU_UTIL"], gpu), node,
                      steps(LO, HI, lambda t, f=fell: 0 if t < START + 30 or t >= f else 97)))
    return s


PCI = ["3B", "5D", "9A", "CB"]
FIRST, OTHERS = END - 700, END - 400


def _gpu(template: str, gpu: int) -> str:
    """dcgm-exporter's series for GPU `gpu` of a node (the recorded line is GPU 0's)."""
    return (template.replace('gpu="0"', f'gpu="{gpu}"').replace("nvidia0", f"nvidia{gpu}")
            .replace(":3B:00.0", f":{PCI[gpu]}:00.0").replace("8e90", f"8e9{gpu}"))


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    if not have_prometheus():
        pytest.skip("prometheus / promtool not installed (tests/integration/setup-system.sh "
                    "installs Debian's prometheus package)")
    p = Prometheus(tmp_path_factory.mktemp("prom"), openmetrics(_samples()))
    yield p
    p.stop()


PASSWORD = "correct-horse-5b1e07"


@pytest.fixture(scope="module")
def secure_prom(tmp_path_factory):
    """Prometheus as sites run it: TLS (a CA of its own) and basic auth (--web.config.file)."""
    if not have_prometheus():
        pytest.skip("prometheus / promtool not installed (tests/integration/setup-system.sh)")
    pytest.importorskip("bcrypt", reason="the bcrypt test extra hashes the password")
    x = exposition()
    samples = [(x["DCGM_FI_DEV_XID_ERRORS"], "gn-xid",
                steps(LO, HI, lambda t: 0 if t < FAIL else 79))]
    p = Prometheus(tmp_path_factory.mktemp("secure-prom"), openmetrics(samples),
                   secure=("sattrib", PASSWORD))
    yield p
    p.stop()


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))


def _folder(root: Path, nodes: str, journal: dict) -> Path:
    (root / "slurm").mkdir(parents=True)
    (root / "slurm" / "job.txt").write_text(
        f"JobId=9100 JobName=pretrain\n   UserId=alice(41001) GroupId=ml(5000)\n"
        f"   JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0 Restarts=0\n"
        f"   StartTime={_iso(START)} EndTime={_iso(END)}\n   Partition=gpu\n"
        f"   NodeList={nodes}\n")
    (root / "logs").mkdir()
    (root / "logs" / "slurm-9100.out").write_text(
        "[rank0]: RuntimeError: NCCL communicator was aborted on rank 0\n")
    for node, text in journal.items():
        (root / node).mkdir()
        (root / node / "journal.log").write_text(text)
    return root


def _settings(url, **kw):
    return Settings(prometheus_url=url, prometheus_timeout_s=kw.pop("timeout", 5.0),
                    prometheus_budget_s=kw.pop("budget", 20.0), **kw)


def _diagnose_with_metrics(tmp_path, st, nodes, journal=None):
    folder = _folder(tmp_path / "ev", ",".join(nodes), journal or {})
    got = prometheus.fetch(st, nodes, START, END, time.monotonic() + 60)
    prometheus.write_bundle(folder, got)
    d, _ = analyze_folder(folder)
    return d, got, folder


QUIET = f"{time.strftime('%b %d %H:%M:%S', time.gmtime(START + 60))} gn-x kernel: hrtimer ok\n"


@pytest.mark.prometheus
def test_xid79_seen_only_in_metrics_names_the_gpu(prom, tmp_path):
    # gn-xid's journal rotated (nothing about the GPU in it); the other node is healthy.
    d, got, folder = _diagnose_with_metrics(tmp_path, _settings(prom.url), ["gn-xid", "gn-ecc2"],
                                            {"gn-xid": QUIET})
    root = d.root_cause
    assert (root.category.value, root.node, root.gpu) == ("gpu_hardware", "gn-xid",
                                                         "0000:3b:00.0")
    ev = json.dumps(d.model_dump(mode="json"))
    assert "DCGM_FI_DEV_XID_ERRORS" in ev and "xid=79" in ev and "graph=" in ev
    assert "metrics:gn-xid" in d.completeness.present
    saved = json.loads((folder / "gn-xid" / "metrics.json").read_text())
    assert {e["query"].split("{")[0] for e in saved} == set(prometheus.DEFAULT_SERIES)
    xid = [e for e in saved if e["query"].startswith("DCGM_FI_DEV_XID_ERRORS")][0]
    assert "gn-xid" in xid["query"] and "gn-ecc2" not in xid["query"]    # this node's query
    assert len(xid["result"]) == 2 and all(
        r["metric"]["Hostname"] == "gn-xid" for r in xid["result"])
    # Batched: one query per series for all the job's nodes.
    assert got.queries == len(prometheus.DEFAULT_SERIES)
    # Replay: the bundle alone gives the same diagnosis, with no Prometheus involved.
    prom_url = prom.url
    again, _ = analyze_folder(folder)
    assert again.root_cause.model_dump() == root.model_dump()
    assert prom_url not in json.dumps([n for n in again.completeness.notes])


def _by_hand(prom, node: str) -> list:
    """metrics.json as an admin collects it: one query for every series of the node, straight
    from the HTTP API over the job's window, saved with no range and no UI link."""
    import requests
    q = f'{{__name__=~"DCGM_FI_.*|node_infiniband_.*", Hostname="{node}"}}'
    r = requests.post(prom.url + "/api/v1/query_range", timeout=10,
                      data={"query": q, "start": START, "end": END, "step": 15})
    r.raise_for_status()
    return [{"query": q, "result": r.json()["data"]["result"]}]


@pytest.mark.prometheus
@pytest.mark.parametrize("node", ["gn-xid", "gn-born"])
def test_metrics_collected_by_hand_with_one_query_give_the_same_diagnosis(prom, tmp_path, node):
    fetched, _, _ = _diagnose_with_metrics(tmp_path / "fetched", _settings(prom.url),
                                           [node, "gn-ecc2"], {node: QUIET})
    folder = _folder(tmp_path / "hand", f"{node},gn-ecc2", {node: QUIET})
    (folder / node / "metrics.json").write_text(json.dumps(_by_hand(prom, node)))
    d, _ = analyze_folder(folder)
    assert (d.root_cause.category.value, d.root_cause.node, d.root_cause.gpu) == \
        (fetched.root_cause.category.value, fetched.root_cause.node, fetched.root_cause.gpu) \
        == ("gpu_hardware", node, "0000:3b:00.0")
    # Each series is named by its own __name__, never by the query's text.
    cited = [e.text for e in d.evidence if e.id in d.root_cause.evidence]
    assert any(t.startswith("DCGM_FI_DEV_XID_ERRORS{") and "xid=79" in t for t in cited)


@pytest.mark.prometheus
def test_ecc_dbe_increase_is_gpu_memory(prom, tmp_path):
    d, _, _ = _diagnose_with_metrics(tmp_path, _settings(prom.url), ["gn-ecc"],
                                     {"gn-ecc": QUIET})
    assert (d.root_cause.category.value, d.root_cause.node, d.root_cause.gpu) == (
        "gpu_memory_ecc", "gn-ecc", "0000:5d:00.0")


@pytest.mark.prometheus
def test_ib_link_downed_on_one_node(prom, tmp_path):
    d, _, _ = _diagnose_with_metrics(tmp_path, _settings(prom.url), ["gn-ib", "gn-ok"],
                                     {"gn-ib": QUIET})
    assert (d.root_cause.category.value, d.root_cause.node) == ("network_ib", "gn-ib")
    assert "mlx5_0/1" in json.dumps(d.model_dump(mode="json"))


@pytest.mark.prometheus
def test_hang_the_gpu_whose_utilisation_fell_first_is_where_the_job_stopped(prom, tmp_path):
    """The hang picture says where, not why: the diagnosis stays unattributed (no cause, no
    "your code") and its localization names the node, on the metric's evidence line."""
    nodes = ["gn-h1", "gn-h2", "gn-h3"]
    d, _, folder = _diagnose_with_metrics(tmp_path, _settings(prom.url), nodes,
                                          {n: QUIET for n in nodes})
    assert d.outcome.value == "unattributed" and d.root_cause is None, d.model_dump(mode="json")
    loc = d.localization
    assert (loc.ranks, loc.nodes) == ([], ["gn-h2"])
    assert "GPU 0000:9a:00.0 on gn-h2 went idle 300 s before the other 11 GPUs" in loc.how
    assert "check that node" in d.explanation and "gn-h2" in d.action
    assert d.action_code.value == "inspect_node" and "drain" not in d.action
    ev = [e for e in d.evidence if e.id in loc.evidence][0]
    assert ev.rule == "metrics.gpu_util_fell_first" and ev.trust.value == "node_telemetry"
    assert "lead=300s others=11" in ev.text and "graph=" in ev.text
    assert ev.path == "gn-h2/metrics.json"
    again, _ = analyze_folder(folder)          # replayed from the bundle, byte for byte
    assert json.dumps(again.model_dump(mode="json"), sort_keys=True) == json.dumps(
        d.model_dump(mode="json"), sort_keys=True)


@pytest.mark.prometheus
def test_hang_two_gpus_fell_first_within_the_step_are_both_named(prom, tmp_path):
    nodes = ["gn-m1", "gn-m2", "gn-m3"]
    d, _, _ = _diagnose_with_metrics(tmp_path, _settings(prom.url), nodes,
                                     {n: QUIET for n in nodes})
    assert d.outcome.value == "unattributed", d.model_dump(mode="json")
    assert d.localization.nodes == ["gn-m1", "gn-m3"]
    assert "within one sampling step of each other" in d.localization.how
    assert {(e.node, e.gpu) for e in d.evidence if e.id in d.localization.evidence} == {
        ("gn-m1", "0000:5d:00.0"), ("gn-m3", "0000:3b:00.0")}


def test_hang_needs_the_others_to_fall_together():
    def fall(node, at):
        return prometheus.Fall(at=at, step=15, node=node, doc=f"{node}/metrics.json", line=1,
                               labels='{gpu="0"}', query="q", ui="", before=97, after=0,
                               lo=0, hi=2000)
    together = [fall("a", 1000), fall("b", 1300), fall("c", 1305), fall("d", 1310)]
    assert [ln.node for ln in prometheus.hang_lines(together)] == ["a"]
    spread = [fall("a", 1000), fall("b", 1100), fall("c", 1300), fall("d", 1500)]
    assert prometheus.hang_lines(spread) == []          # a staggered end, no single first
    close = [fall("a", 1000), fall("b", 1030), fall("c", 1040)]
    assert prometheus.hang_lines(close) == []           # a 30 s lead at 15 s steps: too close
    assert prometheus.hang_lines(together[:2]) == []    # two GPUs are no crowd


@pytest.mark.prometheus
def test_counter_reset_and_stale_xid_are_not_faults(prom, tmp_path):
    d, _, _ = _diagnose_with_metrics(tmp_path, _settings(prom.url), ["gn-reset"],
                                     {"gn-reset": QUIET})
    cats = {c.category.value for c in [d.root_cause] + list(d.candidates or []) if c}
    assert not cats & {"gpu_memory_ecc", "gpu_hardware"}, cats
    # The ECC counter's series is there (absent series are named in the notes).
    assert not any("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" in n and "gn-reset" in n
                   for n in d.completeness.notes)
    assert any("gn-reset: no Prometheus series for" in n and "DCGM_FI_DEV_NVLINK" in n
               for n in d.completeness.notes)


@pytest.mark.parametrize("server", ["closed", "500", "hang"])
@pytest.mark.prometheus
def test_prometheus_down_erroring_or_hanging_leaves_metrics_missing(server, tmp_path):
    srv = None
    if server == "closed":
        url = closed_port_url()
    else:
        srv = Answers500() if server == "500" else NeverAnswers()
        url = srv.url
    try:
        st = _settings(url, timeout=1.0, budget=3.0)
        t0 = time.monotonic()
        d, got, folder = _diagnose_with_metrics(tmp_path, st, ["gn-xid", "gn-ecc"],
                                                {"gn-xid": QUIET})
        assert time.monotonic() - t0 < 3.0 + 5
        assert got.queries == 1                  # the first failure stops the asking
    finally:
        if srv:
            srv.stop()
    assert {"metrics:gn-xid", "metrics:gn-ecc"} <= set(d.completeness.missing)
    why = {"closed": "cannot reach it", "500": "HTTP 500", "hang": "no answer within 1s"}[server]
    assert any(why in n for n in d.completeness.failed_probes), d.completeness.failed_probes
    assert d.root_cause is None or d.root_cause.category.value not in ("gpu_hardware",)


def _password_file(tmp_path, password):
    p = tmp_path / "prom.password"
    p.write_text(password + "\n")
    os.chmod(p, 0o600)
    return str(p)


@pytest.mark.parametrize("case", ["right", "wrong password", "no CA", "another CA"])
@pytest.mark.prometheus
def test_tls_and_basic_auth_on_a_real_prometheus(secure_prom, case, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ca = str(secure_prom.ca)
    if case == "another CA":
        ca = str(self_signed_ca(tmp_path, "not-the-servers-ca")[0])
    password = "wrong-pass-92c3d" if case == "wrong password" else PASSWORD
    st = _settings(secure_prom.url, prometheus_user="sattrib",
                   prometheus_password_file=_password_file(tmp_path, password),
                   prometheus_ca_file="" if case == "no CA" else ca)
    d, got, folder = _diagnose_with_metrics(tmp_path, st, ["gn-xid"], {"gn-xid": QUIET})
    everything = (json.dumps(d.model_dump(mode="json")) + caplog.text + " ".join(got.notes) +
                  "".join(p.read_text() for p in folder.rglob("*") if p.is_file()))
    assert PASSWORD not in everything and "wrong-pass-92c3d" not in everything
    if case == "right":
        assert (d.root_cause.category.value, d.root_cause.node) == ("gpu_hardware", "gn-xid")
        assert "metrics:gn-xid" in d.completeness.present
        return
    assert got.queries == 1                      # the first refusal stops the asking
    assert "metrics:gn-xid" in d.completeness.missing
    assert d.root_cause is None or d.root_cause.category.value != "gpu_hardware"
    why = {"wrong password": "HTTP 401",
           "no CA": "not signed by a CA the system trusts (set prometheus_ca_file)",
           "another CA": f"not signed by prometheus_ca_file {ca}"}[case]
    assert any(why in n for n in d.completeness.failed_probes), d.completeness.failed_probes


@pytest.mark.prometheus
def test_a_server_that_trickles_bytes_is_cut_off_at_the_budget(tmp_path):
    # Every byte comes within the 1s read timeout; the whole answer would take 400s.
    srv = Trickles(gap=0.1, size=4000)
    try:
        st = _settings(srv.url, timeout=1.0, budget=2.0)
        t0 = time.monotonic()
        d, got, _ = _diagnose_with_metrics(tmp_path, st, ["gn-xid"], {"gn-xid": QUIET})
        took = time.monotonic() - t0
    finally:
        srv.stop()
    assert got.queries == 1 and got.seconds < 2.0 + 0.5, (got.queries, got.seconds)
    assert took < 2.0 + 5
    assert "metrics:gn-xid" in d.completeness.missing
    assert any("still arriving when the connector's budget ran out" in n
               for n in d.completeness.failed_probes), d.completeness.failed_probes


@pytest.mark.prometheus
def test_worker_saves_metrics_and_diagnoses_a_node_that_sent_nothing(prom, tmp_path,
                                                                    monkeypatch, caplog):
    """The EpilogSlurmctld worker's own code path: no node snapshot at all (k2 died), the Xid
    is in Prometheus only; the bearer token is sent but never written anywhere."""
    from test_collect import _fake_slurm
    from sattrib.collect import collect_job
    from sattrib.collectors import slurm_env
    work = tmp_path / "work"
    work.mkdir()
    (work / "slurm-8801.out").write_text("[rank1]: RuntimeError: CUDA error: unspecified "
                                         "launch failure\n")
    _fake_slurm(monkeypatch, END, work)             # the job ran END-600 .. END
    st = Settings(cluster="kc", database=str(tmp_path / "d.db"), bundle_dir=str(tmp_path / "b"),
                  spool_dir=str(tmp_path / "spool"), spool_auth="owner", collect_wait_s=0.5,
                  prometheus_url=prom.url, prometheus_token_file=token_file(tmp_path, TOKEN),
                  prometheus_ui_url="https://prometheus.example.org")
    env = slurm_env.from_env({"SLURM_JOB_ID": "8801", "SLURM_JOB_EXIT_CODE": "256",
                              "SLURM_JOB_EXIT_CODE2": "1:0", "SLURM_JOB_NODELIST": "k[1-2]",
                              "SLURM_CLUSTER_NAME": "kc", "SLURM_JOB_RESTART_COUNT": "0"})
    caplog.set_level(logging.DEBUG)
    out = collect_job("8801", st, env_job=env)
    d = out.diagnosis
    assert (d.root_cause.category.value, d.root_cause.node, d.root_cause.gpu) == (
        "gpu_hardware", "k2", "0000:3b:00.0")
    assert (out.bundle / "k2" / "metrics.json").is_file()
    assert "https://prometheus.example.org/graph?" in json.dumps(d.model_dump(mode="json"))
    written = "".join(p.read_text(errors="replace") for p in out.bundle.rglob("*")
                      if p.is_file())
    assert TOKEN not in written and TOKEN not in caplog.text
    assert TOKEN not in Path(st.database).read_bytes().decode("utf-8", "replace")
    replay, _ = analyze_folder(out.bundle)
    assert replay.root_cause.model_dump() == d.root_cause.model_dump()


@pytest.mark.parametrize("mode", [0o644, 0o640])
def test_a_token_file_others_can_read_is_refused(tmp_path, mode):
    """No request is made with a token others could read (no server needed: none is asked)."""
    st = _settings(closed_port_url(), prometheus_token_file=token_file(tmp_path, TOKEN, mode))
    got = prometheus.fetch(st, ["n1"], START, END, time.monotonic() + 5)
    assert got.queries == 0
    assert any("readable or writable by group or others" in n and "chmod 600" in n
               for n in got.notes)
    assert TOKEN not in json.dumps(got.per_node) + " ".join(got.notes)
    lines, _ = prometheus.lines(json.dumps(got.per_node["n1"]), "n1", "n1/metrics.json")
    assert [ln.message.split()[0] for ln in lines] == ["probe=prometheus"]


# -- the pure half ----------------------------------------------------------------------------
def test_counter_increase_handles_resets():
    name = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
    assert prometheus.summarize(name, [(0, "5"), (15, "5"), (30, "0"), (45, "0")]) is None
    s = prometheus.summarize(name, [(0, "5"), (15, "0"), (30, "2"), (45, "3")])
    assert (s["increase"], s["resets"], s["at"]) == (3, 1, 30)


def test_xid_already_there_when_the_window_opened_is_not_this_jobs():
    name = prometheus.XID_SERIES
    assert prometheus.summarize(name, [(0, "79"), (15, "79")], lo=0, step=15) is None
    s = prometheus.summarize(name, [(300, "79"), (315, "79")], lo=0, step=15)
    assert (s["xid"], s["at"]) == (79, 300)           # a series that appeared mid-window
    s = prometheus.summarize(name, [(0, "0"), (15, "13"), (30, "48")], lo=0, step=15)
    assert (s["xid"], s["at"]) == (48, 30)


def test_a_1024_node_job_is_a_few_queries():
    nodes = [f"gpu-a{i:04d}" for i in range(1024)]
    qs = prometheus.queries(prometheus.DEFAULT_SERIES, ["Hostname", "instance"], nodes)
    assert len(qs) == 2 * len(prometheus.DEFAULT_SERIES)
    assert 'Hostname=~"(?:gpu-a0000|' in qs[0][0] and '(?::[0-9]+)?"' in qs[0][0]
    assert {len(batch) for _, _, batch in qs} == {512}
    assert prometheus.node_of({"instance": "gpu-a0007:9100"}, ["Hostname", "instance"]) \
        == "gpu-a0007"
    assert prometheus._node_regex(["a.b"]) == "(?:a\\.b)(?::[0-9]+)?"


def test_credentials_in_the_url_never_reach_notes():
    assert prometheus.redact_url("https://u:pw@prom.example:9090/x") == \
        "https://prom.example:9090/x"


def test_a_url_with_a_password_is_refused_as_a_setting():
    from sattrib.config import InvalidSettings
    with pytest.raises(InvalidSettings, match="prometheus_password_file"):
        Settings(prometheus_url="https://u:pw@prom.example:9090")
    with pytest.raises(InvalidSettings, match="http:// or https://"):
        Settings(prometheus_url="prom.example:9090")


def test_bearer_token_and_basic_auth_are_sent(tmp_path):
    import base64
    srv = Answers()
    try:
        st = _settings(srv.url, prometheus_token_file=token_file(tmp_path, TOKEN))
        got = prometheus.fetch(st, ["n1"], START, END, time.monotonic() + 10)
        pw = tmp_path / "pw"
        pw.write_text("hunter2\n")
        os.chmod(pw, 0o600)
        st = _settings(srv.url, prometheus_user="sattrib", prometheus_password_file=str(pw))
        prometheus.fetch(st, ["n1"], START, END, time.monotonic() + 10)
    finally:
        srv.stop()
    n = len(prometheus.DEFAULT_SERIES)
    assert srv.auth[:n] == [f"Bearer {TOKEN}"] * n
    assert srv.auth[n:] == ["Basic " + base64.b64encode(b"sattrib:hunter2").decode()] * n
    assert TOKEN not in json.dumps(got.per_node) + " ".join(got.notes)


@pytest.mark.parametrize("status", [503, 400])
@pytest.mark.prometheus
def test_an_error_that_echoes_the_credentials_reaches_no_note(tmp_path, status):
    """A proxy in front of Prometheus that refuses (503) or rejects a query (400) with the
    request's headers in its message: notes, metrics.json and the diagnosis keep the status
    and Prometheus's errorType, never the message."""
    srv = Answers(status=status, error_type="bad_data" if status == 400 else "unavailable")
    try:
        st = _settings(srv.url, prometheus_token_file=token_file(tmp_path, TOKEN))
        d, got, folder = _diagnose_with_metrics(tmp_path, st, ["gn-xid"], {"gn-xid": QUIET})
    finally:
        srv.stop()
    everything = (json.dumps(d.model_dump(mode="json")) + " ".join(got.notes) +
                  "".join(p.read_text() for p in folder.rglob("*") if p.is_file()))
    assert TOKEN not in everything and "upstream refused" not in everything
    why = "HTTP 503 (unavailable)" if status == 503 else "HTTP 400 (bad_data)"
    assert any(why in n for n in d.completeness.failed_probes), d.completeness.failed_probes
    assert got.queries == (1 if status == 503 else len(prometheus.DEFAULT_SERIES))


@pytest.mark.prometheus
def test_the_answers_of_one_fetch_are_bounded_in_all(tmp_path, monkeypatch):
    """Each answer under the per-answer cap, but together over the fetch's: the asking stops
    there (a byte of JSON costs several of memory until the bundle is written)."""
    monkeypatch.setattr(prometheus, "MAX_TOTAL_BODY", 3 << 20)
    srv = Answers(size=1 << 20)
    try:
        got = prometheus.fetch(_settings(srv.url), ["n1"], START, END, time.monotonic() + 30)
    finally:
        srv.stop()
    assert got.queries == 4 and got.bytes == 3 << 20
    assert any("the answers passed 3 MiB in all" in n for n in got.notes), got.notes
    errors = [e["error"] for e in got.per_node["n1"] if "error" in e]
    assert len(errors) == len(prometheus.DEFAULT_SERIES) - 3


def test_metrics_json_in_the_jobs_own_output_is_not_evidence(tmp_path, rules):
    """logs/ holds what the job wrote: a metrics.json there stays job output."""
    folder = _folder(tmp_path / "ev", "gn-xid", {"gn-xid": QUIET})
    entry = [{"query": 'DCGM_FI_DEV_XID_ERRORS{Hostname=~"gn-xid"}', "range": [START, END, 15],
              "result": [{"metric": {"Hostname": "gn-xid", "gpu": "0",
                                     "pci_bus_id": "00000000:3B:00.0"},
                          "values": [[FAIL - 15, "0"], [FAIL, "79"]]}]}]
    (folder / "logs" / "metrics.json").write_text(json.dumps(entry))
    d, _ = analyze_folder(folder)
    assert d.root_cause is None or d.root_cause.category.value != "gpu_hardware"
    (folder / "gn-xid" / "metrics.json").write_text(json.dumps(entry))   # the node's own
    d, _ = analyze_folder(folder)
    assert (d.root_cause.category.value, d.root_cause.gpu) == ("gpu_hardware", "0000:3b:00.0")
