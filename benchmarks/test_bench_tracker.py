"""pytest-benchmark for the Tracker (``make bench``): plain forward vs stats / tensor capture
on a zoo model; the overhead ratios of one run are printed by benchmarks/bench_tracker.py
(smoke-tested here on a toy model)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aligntools  # noqa: E402
import bench_tracker  # noqa: E402


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_and_ids():
    import transformers

    from labs import zoo

    root = Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))  # the test suite's zoo cache
    path = zoo.build("tiny-qwen3-moe", out=root / "tiny-qwen3-moe-seed0")
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    return model, torch.randint(3, 500, (4, 64), generator=torch.Generator().manual_seed(0))


def test_plain_forward(benchmark, model_and_ids):
    model, ids = model_and_ids

    def plain():
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    benchmark(plain)


@pytest.mark.parametrize("mode", ["stats", "tensor"])
def test_capture_all_sites(benchmark, model_and_ids, mode):
    model, ids = model_and_ids
    cap = benchmark(lambda: aligntools.capture(model, ids, mode=mode, progress=False))
    assert cap.complete and len(cap.sites) == 53


def test_overhead_script_reports_every_variant_and_the_goals(capsys):
    """benchmarks/bench_tracker.py end to end on a toy model: every variant timed in one run,
    one goal line per mode naming its bound and the nnsight peer."""
    ratios = bench_tracker.main(["--hidden", "128", "--layers", "1", "--seq", "16", "--repeats", "1"])
    assert ratios["plain forward"] == 1.0 and set(bench_tracker.GOALS) <= set(ratios)
    goals = [line for line in capsys.readouterr().out.splitlines() if line.startswith("goal ")]
    assert len(goals) == len(bench_tracker.GOALS) and all("nnsight" in line for line in goals)


def test_device_overhead_times_every_variant_on_the_models_device():
    """The GPU check's tracker stage: on a CPU toy model every variant is timed and the sync
    counts say they were not measured (CUDA only)."""
    model = bench_tracker.build_model(128, 1, 256)
    ids = torch.randint(3, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    got = bench_tracker.device_overhead(model, ids, repeats=2)
    ratios = [got[f"{name}_x"] for name in ("stats", "tensor", "floor_keep", "floor_stats4", "floor_cpu")]
    assert got["device"] == "cpu" and got["plain_ms"] > 0 and all(r > 0 for r in ratios)
    # embed, 9 per layer (attn_norm q k v attn_out resid_mid mlp_norm mlp_out resid_post), final_norm, logits,
    # and the derived logprobs and entropy
    assert got["hooked_modules"] == 3 + 6 and got["sites"] == 1 + 9 + 2 + 2
    assert got["stats_syncs"] is None and got["tensor_d2h"] is None


def test_keep_freed_memory_sets_glibcs_thresholds_in_its_own_process():
    """In a subprocess: the setting would otherwise stay with the test session's process."""
    import subprocess

    code = "import bench_tracker; print(bench_tracker.keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() in ("trim threshold 1 GiB, mmap threshold 32 MiB", "not glibc: unchanged")


def test_row_hash_script_times_every_variant_against_the_baseline(capsys):
    """benchmarks/bench_row_hash.py end to end on small rows: the four variants per width, each
    printed as a ratio to the int8 GEMM baseline of the same run."""
    import bench_row_hash

    medians = bench_row_hash.main(["--rows", "8", "--widths", "5", "64", "--repeats", "2"])
    assert set(medians) == {5, 64} and all(len(m) == 4 and min(m.values()) > 0 for m in medians.values())
    assert capsys.readouterr().out.count("x the baseline") == 8


def test_goal_line_does_not_round_a_miss_into_the_bound():
    """1.054x against a 1.05x bound is a miss, and the line must show why: at two decimals it
    read "1.05x <= 1.05x NOT met"."""
    name = "tracker tensor (all sites)"
    ratios = {"tracker stats (all sites)": 1.10, name: 1.054, bench_tracker.PEER: 1.07}
    paired = {k: (1.0, v, 1.1) for k, v in ratios.items()}
    line = next(ln for ln in bench_tracker.goal_lines(ratios, paired) if name in ln)
    assert "1.054x <= 1.05x NOT met" in line and "below nnsight 1.07x" in line
