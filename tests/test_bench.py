"""bench/run.py reports each tool's median round, not its luckiest one."""
from __future__ import annotations

import importlib.util
from pathlib import Path

RUN = Path(__file__).resolve().parent.parent / "bench" / "run.py"


def _bench_run():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_median_round_is_reported_with_every_round_beside_it():
    run = _bench_run()
    rounds = [{"wall_s": 5.0, "user_s": 1.0}, {"wall_s": 1.0, "user_s": 0.9},
              {"wall_s": 2.0, "user_s": 0.95}]
    med = run.median_run(rounds)
    assert (med["wall_s"], med["user_s"]) == (2.0, 0.95)
    assert med["walls_s"] == [5.0, 1.0, 2.0] and med["runs"] == 3
    # An even count takes the lower of the two middle rounds: a real round, not a mean.
    assert run.median_run(rounds + [{"wall_s": 3.0, "user_s": 1.0}])["wall_s"] == 2.0
