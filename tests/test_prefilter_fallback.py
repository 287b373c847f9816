"""Machines without Hyperscan (aarch64: Grace Hopper) use the pure-Python prefilter: the same
diagnosis, byte for byte, on every case the project has."""
import sys

import pytest

from sattrib.analysis import analyze_folder
from sattrib.engine.rules import load_rules

from test_rule_cache import CASES


@pytest.fixture(scope="module")
def both():
    fast = load_rules(cache=False)
    saved = sys.modules.get("hyperscan")
    sys.modules["hyperscan"] = None              # `import hyperscan` raises ImportError
    try:
        plain = load_rules(cache=False)
        plain.prefilter                          # compiled now, without Hyperscan
    finally:
        if saved is None:
            del sys.modules["hyperscan"]
        else:
            sys.modules["hyperscan"] = saved
    assert fast.prefilter.engine == "hyperscan" and plain.prefilter.engine == "re2"
    return fast, plain


@pytest.mark.parametrize("case", CASES, ids=[f"{c.parent.name}/{c.name}" for c in CASES])
def test_without_hyperscan_the_diagnosis_is_the_same(case, both):
    fast, plain = both
    a, _ = analyze_folder(case, rules=fast)
    b, _ = analyze_folder(case, rules=plain)
    assert b.model_dump_json(indent=2) == a.model_dump_json(indent=2)
