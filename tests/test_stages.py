"""Unit tests of the pipeline's middle stages on hand-made events: correlate, build_incidents,
select, the time window. The end-to-end behaviour is in test_semantics.py and the corpora."""
from sattrib.engine import relations
from sattrib.engine.correlate import correlate, recast, repeats_across_processes
from sattrib.engine.decode import Event
from sattrib.engine.incident import precedes
from sattrib.engine.models import Bundle, JobInfo, Line
from sattrib.engine.refine import build_incidents, select
from sattrib.engine.taxonomy import Category, Role, Source, Tag
from sattrib.engine.window import _last_burst


def ev(rules, rule_id, *, cat=None, role=Role.root, source=Source.stderr, node=None, doc="a",
       offset=0, lo=None, hi=None, rank=None, caps=None, last_resort=False, weak=False,
       explained_by=(), gpu=None, pid=None, tags=()):
    rule = rules.by_id[rule_id].rule
    line = Line(doc=doc, line=1, offset=offset, source=source, node=node, rank=rank,
                message="m")
    e = Event(rule=rule, line=line, caps=dict(caps or {}), category=cat, role=role,
              source=source, node=node, rank=rank, lo=lo, hi=hi, weak=weak,
              last_resort=last_resort, explained_by=tuple(explained_by), gpu=gpu, pid=pid)
    e.tags = frozenset(tags)
    return e


# ---------------------------------------------------------------- correlate


def test_srun_task_lines_place_ranks_on_nodes(rules):
    a = ev(rules, "slurm.task_exit", role=Role.symptom, caps={"node": "n2", "tasks": "8-9"},
           tags=(Tag.task_list,))                     # as the srun_exit decoder marks it
    b = ev(rules, "python.exception", cat=Category.application_error, rank=9, offset=10)
    links = correlate([a, b], Bundle("x", JobInfo(nodes=["n1", "n2"])))
    assert links.rank_node[8] == links.rank_node[9] == "n2"
    assert b.node == "n2"


def test_a_host_outside_the_job_is_not_a_node(rules):
    a = ev(rules, "nccl.socket_error", role=Role.symptom, caps={"nccl_host": "intruder"})
    correlate([a], Bundle("x", JobInfo(nodes=["n1", "n2"])))
    assert a.node is None


def test_without_a_node_list_the_emitters_host_is_the_node(rules):
    a = ev(rules, "nccl.socket_error", role=Role.symptom, caps={"nccl_host": "gpu-7.cluster"})
    b = ev(rules, "nccl.socket_error", role=Role.symptom, caps={"nccl_host": "10.0.0.7"})
    correlate([a, b], Bundle("x", JobInfo()))
    assert a.node == "gpu-7" and b.node is None       # an address is no node name


def test_recast_needs_the_context_line_close_before(rules):
    frame = ev(rules, "host.shm_frame", role=Role.context, offset=100)
    near = ev(rules, "python.errno", cat=Category.storage_io, offset=300)
    far = ev(rules, "python.errno", cat=Category.storage_io, offset=100 + 5000)
    before = ev(rules, "python.errno", cat=Category.storage_io, offset=50)
    recast([before, frame, near, far])
    assert near.category == Category.host_oom
    assert far.category == before.category == Category.storage_io


def test_an_app_xid_repeating_for_several_processes_on_one_gpu_is_the_gpu(rules):
    def x(pid, gpu="0000:3b:00.0"):
        return ev(rules, "gpu.xid", cat=Category.application_error, source=Source.kernel,
                  node="n1", gpu=gpu, pid=pid, caps={"xid": "31"},
                  tags=("repeat_implicates_gpu", "restart_app"))
    same = [x(1), x(2), x(3)]
    repeats_across_processes(same)
    assert {e.category for e in same} == {Category.gpu_hardware}
    one_program = [x(7), x(7), x(7)]
    repeats_across_processes(one_program)
    assert {e.category for e in one_program} == {Category.application_error}
    spread = [x(1, "0000:3b:00.0"), x(2, "0000:5e:00.0"), x(3, "0000:86:00.0")]
    repeats_across_processes(spread)
    assert {e.category for e in spread} == {Category.application_error}


# ---------------------------------------------------------------- build_incidents


def test_a_trusted_gpu_fault_absorbs_what_it_explains_on_its_node(rules):
    xid = ev(rules, "gpu.xid", cat=Category.gpu_hardware, source=Source.kernel, node="n1",
             doc="n1/journal.log", lo=100, hi=101)
    cuda = ev(rules, "cuda.illegal_address", cat=Category.application_error, node="n1",
              doc="n1/rank-0.err", lo=99, hi=100, explained_by=["gpu"])
    other = ev(rules, "cuda.illegal_address", cat=Category.application_error, node="n2",
               doc="n2/rank-8.err", lo=99, hi=100, explained_by=["gpu"])
    incs = build_incidents([xid, cuda, other], 0.0)
    by_node = {i.node: i for i in incs}
    assert by_node["n1"].tier == 3 and by_node["n1"].first is xid
    assert cuda in by_node["n1"].events
    assert by_node["n2"].tier == 2                  # another node's error stays its own


def test_an_error_nothing_says_is_explained_stays_apart(rules):
    xid = ev(rules, "gpu.xid", cat=Category.gpu_hardware, source=Source.kernel, node="n1",
             doc="n1/journal.log")
    exc = ev(rules, "python.exception", cat=Category.application_error, node="n1",
             doc="n1/rank-0.err")
    incs = build_incidents([xid, exc], 0.0)
    assert len(incs) == 2


def test_last_resort_roots_are_tier_one(rules):
    e = ev(rules, "slurm.task_exit", cat=Category.application_error, node="n1",
           last_resort=True)
    (inc,) = build_incidents([e], 0.0)
    assert inc.tier == 1


# ---------------------------------------------------------------- select


def _incs(rules, *events):
    return build_incidents(list(events), 0.0)


def test_the_earliest_incident_wins(rules):
    a = ev(rules, "python.exception", cat=Category.application_error, node="n1", doc="x",
           lo=10, hi=11)
    b = ev(rules, "torch.cuda_oom", cat=Category.cuda_oom, node="n2", doc="y", lo=20, hi=21)
    winners, demoted = select(_incs(rules, a, b), None, 0.0)
    assert [w.first for w in winners] == [a] and [d.first for d in demoted] == [b]


def test_unordered_causes_of_different_kinds_are_ambiguous(rules):
    a = ev(rules, "python.exception", cat=Category.application_error, node="n1", doc="x",
           lo=10, hi=11)
    b = ev(rules, "torch.cuda_oom", cat=Category.cuda_oom, node="n2", doc="y", lo=10, hi=11)
    winners, _ = select(_incs(rules, a, b), None, 0.0)
    assert len(winners) == 2


def test_a_terminator_makes_what_is_not_before_it_teardown(rules):
    term = ev(rules, "slurm.cancelled", cat=Category.scheduler_timelimit,
              source=Source.scheduler, doc="slurm.out", offset=100)
    after = ev(rules, "python.exception", cat=Category.application_error, doc="slurm.out",
               offset=200)
    winners, demoted = select(_incs(rules, after), term, 0.0)
    assert winners == [] and "teardown" in demoted[0].first.tags


def test_a_soft_terminator_only_cuts_what_comes_after_it(rules):
    soft = ev(rules, "slurm.cancelled", cat=Category.scheduler_cancelled, doc="o", offset=100,
              last_resort=True)
    before = ev(rules, "slurm.memory_limit", cat=Category.host_oom, doc="o", offset=50)
    after = ev(rules, "python.exception", cat=Category.application_error, doc="o", offset=150)
    winners, demoted = select(_incs(rules, before, after), None, 0.0, soft)
    assert [w.first for w in winners] == [before]
    assert any(d.first is after and "teardown" in after.tags for d in demoted)


def test_last_resort_counts_only_alone(rules):
    lr = ev(rules, "slurm.task_exit", cat=Category.application_error, node="n1", doc="o",
            offset=10, last_resort=True)
    real = ev(rules, "storage.disk_full", cat=Category.storage_io, node="n2", doc="p",
              offset=10)
    winners, _ = select(_incs(rules, lr, real), None, 0.0)
    assert [w.first for w in winners] == [real]
    winners, _ = select(_incs(rules, lr), None, 0.0)
    assert [w.first for w in winners] == [lr]


def test_a_process_exit_beats_a_network_cause_of_last_resort(rules):
    net = ev(rules, "nccl.socket_error", cat=Category.network_ib, doc="o", offset=10,
             last_resort=True)
    crash = ev(rules, "slurm.task_exit", cat=Category.application_error, node="n2", doc="o",
               offset=20, last_resort=True)
    winners, _ = select(_incs(rules, net, crash), None, 0.0)
    assert [w.first for w in winners] == [crash]


def test_the_same_cause_of_last_resort_on_every_node_names_nobody(rules):
    a = ev(rules, "slurm.task_exit", cat=Category.application_error, node="n1", doc="o",
           offset=10, last_resort=True)
    b = ev(rules, "slurm.task_exit", cat=Category.application_error, node="n2", doc="o",
           offset=20, last_resort=True)
    winners, _ = select(_incs(rules, a, b), None, 0.0)
    assert winners == []


# ---------------------------------------------------------------- order and window


def test_order_within_a_file_and_across_files(rules):
    a = ev(rules, "python.exception", doc="x", offset=5)
    b = ev(rules, "python.exception", doc="x", offset=9)
    c = ev(rules, "python.exception", doc="y", lo=1.0, hi=2.0, node="n1")
    d = ev(rules, "python.exception", doc="z", lo=1.5, hi=2.5, node="n2")
    assert precedes(a, b) and not precedes(b, a)
    assert not precedes(c, d) and not precedes(d, c)          # overlapping intervals
    assert precedes(c, ev(rules, "python.exception", doc="z", lo=2.0, hi=3.0))


def test_last_burst(rules):
    day = 86400.0
    evs = [ev(rules, "python.exception", lo=t, hi=t + 1) for t in (0, 60, 3 * day, 3 * day + 5)]
    assert _last_burst(evs, 6 * 3600) == 3 * day - 600
    assert _last_burst(evs[:2], 6 * 3600) is None              # one burst: nothing to cut


def test_a_version_that_differs_on_one_node_is_that_nodes_fault(rules):
    from sattrib.engine.correlate import version_skew
    evs = [ev(rules, "nccl.version_banner", cat=Category.software_incompat, role=Role.context,
              node=n, doc=f"{n}/o", caps={"ver": v})
           for n, v in (("n1", "2.14.3"), ("n2", "2.19.3"), ("n3", "2.19.3"), ("n3", "2.19.3"))]
    version_skew(evs)
    assert [e.role for e in evs] == [Role.root, Role.context, Role.context, Role.context]
    assert "2.14.3 on n1" in evs[0].detail
    same = [ev(rules, "nccl.version_banner", role=Role.context, node=n, caps={"ver": "2.19.3"})
            for n in ("n1", "n2")]
    version_skew(same)
    assert {e.role for e in same} == {Role.context}


# ---------------------------------------------------------------- relations


def test_a_channel_teardown_alone_on_its_node_is_context(rules):
    tear = ev(rules, "gpu.xid", cat=Category.application_error, role=Role.symptom,
              source=Source.kernel, node="n1", tags=(Tag.gpu_xid, Tag.channel_teardown))
    other = ev(rules, "gpu.xid", cat=Category.gpu_hardware, source=Source.kernel, node="n2",
               tags=(Tag.gpu_xid,))
    relations.apply([tear, other], 0.0)
    assert tear.role == Role.context                  # the other Xid is on another node
    tear.role = Role.symptom
    other.node = "n1"
    relations.apply([tear, other], 0.0)
    assert tear.role == Role.symptom


def test_a_cancel_record_decides_a_bare_banner(rules):
    banner = ev(rules, "slurm.cancelled", cat=Category.scheduler_cancelled, doc="o",
                last_resort=True, tags=(Tag.bare_cancel,))
    banner.suggests = True
    relations.apply([banner], 0.0)
    assert banner.last_resort and banner.suggests
    record = ev(rules, "slurm.job_state", cat=Category.scheduler_cancelled,
                role=Role.confirmation, source=Source.scheduler, doc="s",
                tags=(Tag.cancel_record,))
    relations.apply([banner, record], 0.0)
    assert not banner.last_resort and not banner.suggests


def test_an_exit_code_is_proven_only_by_a_teardown_after_it_in_its_file(rules):
    code = ev(rules, "slurm.task_exit", cat=Category.application_error, doc="o", offset=50,
              last_resort=True, tags=(Tag.task_exit, Tag.exit_code))
    code.suggests = True
    earlier = ev(rules, "slurm.task_exit", role=Role.symptom, doc="o", offset=10,
                 tags=(Tag.task_exit, Tag.task_killed))
    elsewhere = ev(rules, "slurm.task_exit", role=Role.symptom, doc="p", offset=90,
                   tags=(Tag.task_exit, Tag.task_killed))
    relations.apply([code, earlier, elsewhere], 0.0)
    assert code.suggests
    later = ev(rules, "slurm.task_exit", role=Role.symptom, doc="o", offset=90,
               tags=(Tag.task_exit, Tag.task_killed))
    relations.apply([code, later], 0.0)
    assert not code.suggests


def test_a_crash_not_after_a_network_error_of_last_resort_doubts_it(rules):
    net = ev(rules, "nccl.socket_error", cat=Category.network_ib, node="n1", doc="a",
             lo=100.0, hi=101.0, last_resort=True)
    late = ev(rules, "python.exception", cat=Category.application_error, node="n2", doc="b",
              lo=200.0, hi=201.0)
    relations.apply([net, late], 0.0)
    assert not net.suggests                       # the crash came after: it explains nothing
    early = ev(rules, "python.exception", cat=Category.application_error, node="n2", doc="c",
               lo=50.0, hi=51.0)
    relations.apply([net, late, early], 0.0)
    assert net.suggests
    crashes = [e for e in (net, late, early) if relations.crash(e)]
    assert relations.first_doubter("network", net, crashes, 0.0) is early
    assert relations.first_doubter("workload", net, crashes, 0.0) is None
