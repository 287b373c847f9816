"""The innermost frames of the user's own code, from the Python traceback above the error line
of a real posted job output: in the diagnosis JSON (root_cause.user_frames), in the text view and
on the dashboard's diagnosis page for admins only."""
import json
import shutil
from pathlib import Path

from sattrib.analysis import analyze_folder, load_rules
from sattrib.render import render

from sattrib.collectors.frames import frames_before, is_user_file

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
         "function": "allreduce_params"},
        {"file": "/userhome/megatron/megatron/training.py", "line": 265,
         "function": "backward_step"},
        {"file": "/userhome/megatron/megatron/training.py", "line": 300,
         "function": "train_step"}]
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
