"""The innermost frames of the user's own code, from the Python traceback above the error line
of a real posted job output: in the diagnosis JSON (root_cause.user_frames), in the text view and
on the dashboard's diagnosis page for admins only."""
import json
import re
import shutil
from pathlib import Path

from sattrib.analysis import analyze_folder, load_rules
from sattrib.render import render

from sattrib.collectors.frames import frames_before, innermost, is_user_file

CASES = Path(__file__).parent / "cases-real"
MEGATRON = CASES / "r2a-megatron-64v100-mp2-flatten-grads-cuda-oom"


def test_cuda_oom_names_the_users_innermost_frames(tmp_path):
    folder = tmp_path / "job"
    shutil.copytree(MEGATRON, folder)
    d, _ = analyze_folder(folder, rules=load_rules())
    assert d.root_cause.category.value == "cuda_oom"
    frames = [f.model_dump() for f in d.root_cause.user_frames]
    assert frames == [
        {"file": "/userhome/megatron/megatron/model/distributed.py", "line": 53,
         "function": "allreduce_params", "exception": None},
        {"file": "/userhome/megatron/megatron/training.py", "line": 265,
         "function": "backward_step", "exception": None},
        {"file": "/userhome/megatron/megatron/training.py", "line": 300,
         "function": "train_step", "exception": None}]
    again, _ = analyze_folder(folder, rules=load_rules())
    assert again.model_dump_json() == d.model_dump_json()
    text = render(json.loads(d.model_dump_json()))
    assert "in your code: " in text and "distributed.py:53" in text and "allreduce_params" in text


def test_assert_in_user_script_from_real_interleaved_output():
    d, _ = analyze_folder(CASES / "wl-paimegatron-rank3-nan-grad-norm-assert", rules=load_rules())
    assert d.root_cause.category.value == "application_error"
    assert [(f.file.rsplit("/", 1)[-1], f.line, f.function) for f in d.root_cause.user_frames] \
        == [("pretrain_megatron_baichuan.py", 101, "<module>")]


def test_infrastructure_causes_get_no_frames():
    d, _ = analyze_folder(CASES / "wl-naifu-fabric-rank3-eio-makedirs", rules=load_rules())
    assert d.root_cause.category.value == "storage_io" and d.root_cause.user_frames == []


def test_only_the_last_traceback_and_only_user_files():
    lines = ['  File "/old/other.py", line 1, in x',
             "During handling of the above exception, another exception occurred:",
             "Traceback (most recent call last):",
             '[rank3]:   File "/w/train.py", line 40, in <module>',
             '[rank3]:   File "/w/packed.py", line 118, in pack',
             '[rank3]:   File "/usr/lib/python3.10/os.py", line 225, in makedirs',
             '[rank3]:   File "/venv/lib/python3.11/site-packages/torch/nn/module.py", line 9, in f',
             "[rank3]: KeyError: 'x'"]
    assert frames_before(lines) == [{"file": "/w/packed.py", "line": 118, "function": "pack"},
                                    {"file": "/w/train.py", "line": 40, "function": "<module>"}]
    assert not is_user_file("<frozen runpy>") and not is_user_file("/src/pytorch/torch/a.py")
    assert is_user_file("pretrain_gpt2.py")


def test_dashboard_shows_frames_to_admins_only(tmp_path):
    from sattrib.store import Store
    from tests.test_dashboard_privacy import root_cookie, run
    rules = load_rules()
    store = Store(tmp_path / "diagnoses.db")
    d, _ = analyze_folder(MEGATRON, rules=rules)
    d.job_id = "7"
    store.upsert(d, "test", bundle_path=str(MEGATRON))
    store.sync_rules(rules)

    async def requests(ds, client):
        c = root_cookie(ds)
        return [(await client.get(p, cookies=k)).text for k in (None, c)
                for p in ("/diagnosis/test/7/0", "/diagnosis/test/7/0.json")]
    anon_html, anon_json, admin_html, admin_json = run(tmp_path / "diagnoses.db", requests)
    assert "distributed.py:53" in admin_html and "allreduce_params" in admin_html
    assert json.loads(admin_json)["diagnosis"]["root_cause"]["user_frames"][0]["line"] == 53
    assert "distributed.py" not in anon_html and "distributed.py" not in anon_json


JOB_TXT = """JobId=77 JobName=t
   UserId=carol(41003) GroupId=ml(5000) MCS_label=N/A
   JobState=FAILED Reason=NonZeroExitCode Dependency=(null)
   StartTime=2026-04-12T09:00:00 EndTime=2026-04-12T09:01:10 Deadline=N/A
   Partition=gpu NodeList=n1 NumNodes=1 NumTasks=1
"""
# rank 29 of ../shared/cases/rank_exception_then_watchdog: the loop re-raises a worker's error
DATALOADER = """Traceback (most recent call last):
  File "/home/jlee/proj/llm/train.py", line 441, in <module>
    main()
  File "/home/jlee/proj/llm/train.py", line 392, in main
    batch = next(train_iter)
  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/dataloader.py", line 630, in __next__
    data = self._next_data()
  File "/usr/local/lib/python3.10/dist-packages/torch/_utils.py", line 706, in reraise
    raise exception
KeyError: Caught KeyError in DataLoader worker process 3.
Original Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/_utils/worker.py", line 309, in _worker_loop
    data = fetcher.fetch(index)  # type: ignore[possibly-undefined]
  File "/usr/local/lib/python3.10/dist-packages/torch/utils/data/_utils/fetch.py", line 52, in <listcomp>
    data = [self.dataset[idx] for idx in possibly_batched_index]
  File "/home/jlee/proj/llm/data/packed.py", line 118, in __getitem__
    ids = rec["input_ids"]
          ~~~^^^^^^^^^^^^^
KeyError: 'input_ids'
"""
CHAINED = """Traceback (most recent call last):
  File "/home/carol/data/load.py", line 12, in read_record
    return table[key]
KeyError: 'input_ids'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/home/carol/train.py", line 40, in main
    batch = load(i)
  File "/home/carol/data/load.py", line 20, in load
    log.error("no record %s" % key)
NameError: name 'log' is not defined
"""
CHILD_FAILED = """E0412 09:01:02.331000 139 torch/distributed/elastic/multiprocessing/api.py:833] failed (exitcode: 1) local_rank: 0 (pid: 2192853) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 264, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
train.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-04-12_09:01:01
  host      : n1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 2192853)
  error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json
  traceback : Traceback (most recent call last):
    File "/usr/local/lib/python3.10/dist-packages/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 348, in wrapper
      return f(*args, **kwargs)
    File "/home/carol/train.py", line 40, in main
      batch = load(i)
    File "/home/carol/data/load.py", line 12, in load
      return table[key]
  KeyError: 'input_ids'

============================================================
"""


def _job(tmp_path, name: str, text: str):
    folder = tmp_path / "job"
    (folder / "slurm").mkdir(parents=True)
    (folder / "slurm" / "job.txt").write_text(JOB_TXT)
    (folder / "n1").mkdir()
    (folder / "n1" / name).write_text(text)
    d, _ = analyze_folder(folder, rules=load_rules())
    return d, re.sub(r"\x1b\[[0-9;]*m", "", render(json.loads(d.model_dump_json())))


def test_a_dataloader_workers_error_points_at_the_dataset_not_the_loop(tmp_path):
    d, text = _job(tmp_path, "rank-29.stderr", DATALOADER)
    frames = [f.model_dump() for f in d.root_cause.user_frames]
    assert frames[0] == {"file": "/home/jlee/proj/llm/data/packed.py", "line": 118,
                         "function": "__getitem__", "exception": "KeyError: 'input_ids'"}
    assert [f["line"] for f in frames[1:]] == [392, 441]
    assert "raised KeyError" in d.root_cause.summary and "input_ids" not in d.root_cause.summary
    assert "in your code: /home/jlee/proj/llm/data/packed.py:118 in __getitem__" in text
    assert "raised:       KeyError: 'input_ids'" in text


def test_a_chained_exception_points_at_its_first_cause(tmp_path):
    lines = CHAINED.splitlines()
    frames, exception = innermost(lines)
    assert frames[0] == {"file": "/home/carol/data/load.py", "line": 12,
                         "function": "read_record"}
    assert exception == "KeyError: 'input_ids'"
    assert [f["line"] for f in frames[1:]] == [20, 40]


def test_a_child_failed_error_points_at_its_root_causes_traceback(tmp_path):
    d, text = _job(tmp_path, "torchrun.log", CHILD_FAILED)
    frames = [(f.file, f.line) for f in d.root_cause.user_frames]
    assert frames == [("/home/carol/data/load.py", 12), ("/home/carol/train.py", 40)]
    assert d.root_cause.user_frames[0].exception == "KeyError: 'input_ids'"
    # the type is public, the message is the user's text: only where evidence is shown
    assert "KeyError" in d.root_cause.summary and "input_ids" not in d.root_cause.summary
    assert "raised:       KeyError: 'input_ids'" in text
