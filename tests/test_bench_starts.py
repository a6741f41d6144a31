"""bench/starts.py's summary of fresh starts: spread, per-limit figures, correlations."""
import os

import numpy as np

from bench import starts


def row(workload, tok_s, bw, peak, **host):
    return {"workload": workload, "tok_s": tok_s, "bw_gbs": bw, "bf16_gflops": peak, "host": host}


def test_decode_is_normalised_by_bandwidth_prefill_by_peak():
    assert starts.normalised(row("decode1", 150.0, 50.0, 400)) == 3.0
    assert starts.normalised(row("prefill512", 1200.0, 50.0, 400)) == 3.0
    assert starts.normalised(row("probe", None, 50.0, 400)) is None


def test_spread_skips_missing_values():
    assert starts.spread([2.0, None, 3.0, 4.0]) == {"min": 2.0, "median": 3.0, "max": 4.0, "max_over_min": 2.0}
    assert starts.spread([None]) == {}


def test_correlation_matches_numpy_and_needs_variation():
    xs, ys = [1.0, 2.0, 4.0, 3.5], [2.0, 2.5, 5.0, 3.0]
    assert starts.correlation(xs, ys) == round(np.corrcoef(xs, ys)[0, 1], 2)
    assert starts.correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    assert starts.correlation([1.0, None, 3.0, 2.0], [1.0, 5.0, 3.0, None]) is None  # two pairs left


def test_summary_spreads_the_figure_over_its_limit():
    rows = [row("decode1", 100.0, 40.0, 400, cpu_share=1.0, migrations=3, huge_share=0.9),
            row("decode1", 150.0, 60.0, 420, cpu_share=0.99, migrations=5, huge_share=0.9),
            row("decode1", 125.0, 50.0, 410, cpu_share=0.98, migrations=4, huge_share=0.8)]

    class Args:
        model, env = "default", []
    out = starts.summary("decode1", rows, Args)
    assert out["tok_s"]["max_over_min"] == 1.5
    assert out["per_limit"]["max_over_min"] == 1.0  # every start at 2.5 tok/s per GB/s
    assert out["corr_with"]["bw_gbs"] == 1.0
    assert out["probe_bw_gbs"]["max_over_min"] == 1.5


def test_a_start_serves_its_workload(tiny_model):
    """One start's child end to end: it serves decode1 and reports its figure and host readings
    (the child once fell out of step with bench/engine.py's run_workload signature)."""
    class Args:
        child, model, quant, threads = "decode1", os.path.join(tiny_model, "tiny"), None, 1

    result = starts.child(Args)
    assert result["workload"] == "decode1" and result["tok_s"] > 0
    assert 0 < result["host"]["cpu_share"] <= 1.5
