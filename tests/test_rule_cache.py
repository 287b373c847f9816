"""The compiled rule set cached on disk: the same answers as loading from source, and a cache
file anyone but its reader could have written is never unpickled."""
import hashlib
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sattrib.analysis import analyze_folder
from sattrib.engine import rule_cache
from sattrib.engine.rules import BUILTIN_DIR, RuleSet, input_files, input_roots, load_rules

TESTS = Path(__file__).parent
SHARED = Path("/work/shared")
CASE_ROOTS = [TESTS / "cases-real", TESTS / "cases", SHARED / "cases", SHARED / "cases-real"]
CASES = [p for root in CASE_ROOTS if root.is_dir() for p in sorted(root.iterdir())
         if p.is_dir() and not p.name.startswith((".", "_"))]


def _build(extra, builtin):
    return load_rules(extra, builtin, cache=False)


def _cached(where, extra=()):
    return rule_cache.cached(lambda: _build(list(extra), True), input_roots(extra, True),
                             input_files, RuleSet, where=where)


def _key():
    return rule_cache.cache_key(input_roots([], True), input_files)


def _only_file(where: Path) -> Path:
    files = [p for p in where.iterdir() if p.suffix == ".pickle"]
    assert len(files) == 1, files
    return files[0]


def _loads_ok(where: Path) -> bool:
    name, key = _key()
    fd = rule_cache.open_trusted_dir(where, create=False)
    try:
        return isinstance(rule_cache.read(fd, name, key), RuleSet)
    finally:
        os.close(fd)


def _plant(where: Path, payload: bytes) -> Path:
    """A cache file with a valid header and digest for the current key around `payload`."""
    name, key = _key()
    data = (rule_cache.FORMAT + key.encode() + b"\n" +
            hashlib.sha256(payload).hexdigest().encode() + payload)
    where.mkdir(mode=0o700, exist_ok=True)
    path = where / name
    path.write_bytes(data)
    path.chmod(0o600)
    return path


class _Mkdir:
    """Unpickling this runs os.mkdir(target): evidence that a file was loaded."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_cached_rules_give_byte_identical_diagnoses_on_every_case(tmp_path):
    assert CASES, "no case folders found"
    where = tmp_path / "cache"
    _cached(where)                                   # builds and writes
    name, key = _key()
    fd = rule_cache.open_trusted_dir(where, create=False)
    try:
        cached = rule_cache.read(fd, name, key)      # what the next start loads
    finally:
        os.close(fd)
    assert isinstance(cached, RuleSet)
    fresh = load_rules(cache=False)
    assert cached.version == fresh.version and cached.literal_keys == fresh.literal_keys
    for case in CASES:
        a, _ = analyze_folder(case, rules=fresh)
        b, _ = analyze_folder(case, rules=cached)
        assert b.model_dump_json(indent=2) == a.model_dump_json(indent=2), case


def test_cache_hit_loads_neither_yaml_nor_the_rule_files(tmp_path):
    where = tmp_path / "cache"
    code = ("import sys; from sattrib.engine import rule_cache; "
            "from sattrib.engine.rules import RuleSet, input_files, input_roots, load_rules; "
            "rs = rule_cache.cached(lambda: load_rules(cache=False), input_roots([], True), "
            f"input_files, RuleSet, where=__import__('pathlib').Path({str(where)!r})); "
            "print(len(rs), 'yaml' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout.split()
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert first[1] == "True"                         # a miss parses the YAML
    assert second == [first[0], "False"]              # a hit does not, and has every rule


def test_a_site_rule_change_rebuilds_the_cache(tmp_path):
    c = load_rules(cache=False).rules[0]           # overridden by a site copy of itself
    site = tmp_path / "site" / c.path
    site.parent.mkdir(parents=True)
    text = (BUILTIN_DIR / c.path).read_text()
    site.write_text(text)
    where = tmp_path / "cache"
    a = _cached(where, [tmp_path / "site"])
    assert _cached(where, [tmp_path / "site"]).version == a.version
    site.write_text(re.sub(r"(?m)^title: .*$", "title: Site copy", text, count=1))
    b = _cached(where, [tmp_path / "site"])
    assert b.version != a.version
    assert b.by_id[c.rule.id].rule.title == "Site copy"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_a_cache_file_owned_by_another_user_is_not_loaded_but_rebuilt(tmp_path):
    where = tmp_path / "cache"
    marker = tmp_path / "unpickled"
    path = _plant(where, pickle.dumps(_Mkdir(marker)))
    os.chown(path, 54321, 54321)
    rs = _cached(where)
    assert not marker.exists(), "an untrusted cache file was unpickled"
    assert isinstance(rs, RuleSet) and len(rs) > 0
    st = _only_file(where).stat()
    assert st.st_uid == os.geteuid()                 # replaced by the reader's own file
    assert _loads_ok(where)


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_group_or_world_writable_cache_file_is_not_loaded_but_rebuilt(tmp_path, mode):
    where = tmp_path / "cache"
    marker = tmp_path / "unpickled"
    path = _plant(where, pickle.dumps(_Mkdir(marker)))
    path.chmod(mode)
    rs = _cached(where)
    assert not marker.exists(), "a writable-by-others cache file was unpickled"
    assert isinstance(rs, RuleSet)
    assert _only_file(where).stat().st_mode & 0o777 == 0o600


def test_a_cache_in_a_folder_others_can_write_is_neither_read_nor_written(tmp_path):
    where = tmp_path / "cache"
    marker = tmp_path / "unpickled"
    path = _plant(where, pickle.dumps(_Mkdir(marker)))
    where.chmod(0o777)
    rs = _cached(where)
    assert not marker.exists()
    assert isinstance(rs, RuleSet)
    assert path.read_bytes().endswith(pickle.dumps(_Mkdir(marker)))   # left as it was


def test_a_symlinked_cache_file_or_folder_is_not_followed(tmp_path):
    real = tmp_path / "real"
    marker = tmp_path / "unpickled"
    planted = _plant(real, pickle.dumps(_Mkdir(marker)))
    link_dir = tmp_path / "cache"
    link_dir.mkdir(mode=0o700)
    (link_dir / planted.name).symlink_to(planted)
    assert isinstance(_cached(link_dir), RuleSet)
    assert not marker.exists()
    (tmp_path / "via-link").symlink_to(real)
    assert isinstance(_cached(tmp_path / "via-link"), RuleSet)
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty", "not-a-ruleset"])
def test_a_corrupt_cache_file_is_rebuilt_silently(tmp_path, damage):
    where = tmp_path / "cache"
    good = _cached(where)
    path = _only_file(where)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    elif damage == "empty":
        path.write_bytes(b"")
    else:
        path.unlink()
        _plant(where, pickle.dumps(["a list, not a rule set"]))
    rs = _cached(where)
    assert isinstance(rs, RuleSet) and rs.version == good.version
    assert _loads_ok(where) and _only_file(where).read_bytes() != data[: len(data) // 2]


def test_a_stale_key_is_rebuilt(tmp_path):
    where = tmp_path / "cache"
    _cached(where)
    path = _only_file(where)
    data = path.read_bytes()
    head = len(rule_cache.FORMAT)
    path.write_bytes(data[:head] + b"0" * 64 + data[head + 64:])   # another key
    rs = _cached(where)
    assert isinstance(rs, RuleSet)
    assert _loads_ok(where)


def test_old_cache_files_are_pruned_and_the_ones_in_use_kept(tmp_path):
    where = tmp_path / "cache"
    where.mkdir(mode=0o700)
    _cached(where)                                    # the built-in set's file
    mine = _only_file(where)
    os.utime(mine, (1_000_000, 1_000_000))            # old, but read below: kept
    assert isinstance(_cached(where), RuleSet)
    old = []
    for i in range(10):                               # other rule-folder sets, long unused
        p = where / f"{i:024x}.pickle"
        p.write_bytes(b"x")
        p.chmod(0o600)
        os.utime(p, (2_000_000 + i, 2_000_000 + i))
        old.append(p)
    dead = where / f".{mine.name}.123.abcd"           # a writer that died mid-write
    dead.write_bytes(b"x")
    os.utime(dead, (1_000_000, 1_000_000))
    busy = where / f".{mine.name}.456.ef01"           # one writing now
    busy.write_bytes(b"x")
    site = tmp_path / "site"
    site.mkdir()
    _cached(where, [site])                            # a new set: written, then pruned
    left = sorted(p.name for p in where.iterdir() if p.suffix == ".pickle")
    assert len(left) == rule_cache.KEEP_FILES
    assert mine.name in left
    assert [p.name for p in old[-(rule_cache.KEEP_FILES - 2):]] == \
        [n for n in left if n in {p.name for p in old}]
    assert not dead.exists() and busy.exists()
