"""The verdicts of the long-run scripts: the soak's fit and flat/grows call, and the chaos
run's choice of the latest complete snapshot set (worked out by hand)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "scripts"))

import chaos  # noqa: E402
import soak  # noqa: E402


def test_slope_of_a_straight_line_and_of_a_constant():
    assert soak.fit_slope([0, 1000, 2000, 3000], [100, 102, 104, 106]) == pytest.approx(0.002)
    assert soak.fit_slope([0, 1000, 2000], [5, 5, 5]) == 0.0


def test_soak_calls_growth_past_the_tolerance_and_only_growth():
    # rows are (iteration, seconds, RSS MiB, descriptors); the first 10% is warm-up
    leaking = [(i, 0.0, 100 + i / 1000.0, 7) for i in range(0, 10001, 500)]
    falling = [(i, 0.0, 140 - i / 500.0, 7) for i in range(0, 10001, 500)]
    fd_leak = [(i, 0.0, 100.0, 7 + i // 2000) for i in range(0, 10001, 500)]
    out = soak.summarize({0: leaking, 1: falling, 2: fd_leak}, warmup_iters=1000,
                         rss_tolerance=8.0)
    assert out[0]["rss_mib"]["fitted_growth"] == 9.0          # 1 MiB per 1000 from 1000 on
    assert out[0]["rss_mib"]["flat"] is False and out[0]["fds"]["flat"] is True
    assert out[0]["rss_mib"]["start"] == 101.0 and out[0]["rss_mib"]["end"] == 110.0
    assert out[1]["rss_mib"]["flat"] is True                  # memory handed back
    assert out[2]["fds"]["flat"] is False and out[2]["fds"]["max"] == 12


def test_latest_complete_snapshot_set_needs_every_rank_file(tmp_path):
    prefix = str(tmp_path / "lenet")
    for it in (10, 20, 30):
        for path in chaos.snapshot_set(prefix, it):
            if it == 30 and path.endswith(".rank1.rngstate"):
                continue                  # the kill came before rank 1 wrote its side file
            open(path, "w").close()
    assert chaos.snapshot_set(prefix, 30)[-1] == prefix + "_iter_30.rank1.rngstate"
    assert chaos.snapshot_iters(prefix) == [10, 20, 30]
    assert chaos.latest_complete(prefix) == 20
    os.remove(prefix + "_iter_20.caffemodel")
    assert chaos.latest_complete(prefix) == 10
