"""The GPU check (``python -m benchmarks.gpu_check``): its CPU dry run, its budgets and isolation,
its report and the wheels that travel to the card.

The dry run runs with ``benchmarks/gpu_check/card_only`` first on the path, which hides every
installed package a lent card lacks (save the carried wheels): it passing here is the evidence that
the card run can only fail for GPU reasons. The fake stages below run in the check's own worker
processes, which import them from this module (so this module imports nothing heavy).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from benchmarks.gpu_check import wheels
from benchmarks.gpu_check.plan import dry_plan
from benchmarks.gpu_check.report import fmt, summary_table, write_report
from benchmarks.gpu_check.runner import Recorder, Stage, run_stages, stage_env
from benchmarks.gpu_check.stages import STAGES

REPO = Path(__file__).resolve().parents[1]
CARD_ONLY = REPO / "benchmarks" / "gpu_check" / "card_only"


# ---------------------------------------------------------------- the dry run, every stage


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("gpu-check")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CARD_ONLY), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--dry-run", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return report, proc.stdout, out


def test_dry_run_runs_every_stage_and_reports_numbers(dry_run):
    report, stdout, _ = dry_run
    stages = {r["stage"]: r for r in report["stages"]}
    assert list(stages) == [s.name for s in STAGES]
    for name, r in stages.items():
        assert r["status"] == "ok", (name, r["errors"])
        numbers = [v for v in r["metrics"].values() if isinstance(v, (int, float)) and math.isfinite(v)]
        assert numbers, f"stage {name} reported no finite number: {r['metrics']}"
        assert f"| {name} | ok |" in stdout  # the printed summary table
    assert report["meta"]["dry_run"] is True


def test_dry_run_stage_numbers_say_what_the_stages_checked(dry_run):
    stages = {r["stage"]: r["metrics"] for r in dry_run[0]["stages"]}
    assert stages["gpu_tests"]["tests"] >= 1 and stages["gpu_tests"]["skipped"] == stages["gpu_tests"]["tests"]
    ulps = [v for k, v in stages["kernels"].items() if k.endswith("max_ulp")]
    assert len(ulps) == 2 * (3 + len(dry_plan().router["experts"]))  # 4 ops (router per expert count) x 2 dtypes
    assert all(math.isfinite(u) for u in ulps)
    assert all(c.split("=")[0].endswith("/torch") for c in stages["gpu_rl"]["logprob calls"].split(", "))  # CPU
    assert "beyond seed noise" in stages["gpu_rl"]["verdict"]
    for arm in dry_plan().gpu_rl["arms"]:
        assert stages["gpu_rl"][f"{arm} steps"] == dry_plan().gpu_rl["config"]["steps"]
        assert stages["gpu_rl"][f"{arm} steps with grad norm > 0"] >= 1  # the warm-up gives the rewards variance
        assert stages["gpu_rl"][f"{arm} median sync ms"] > 0
    assert stages["engine"]["tiny-qwen3-moe aligned fp32 mean|dlogp|"] <= 1e-5
    for batch in dry_plan().decode["batches"]:
        assert stages["engine"][f"batch {batch} minirl / transformers static"] > 0
    assert stages["engine"]["minirl cuda graphs"].startswith("skipped: ")  # said, not silently missing
    assert stages["tracker"]["sites"] > 0


def test_dry_run_writes_the_rl_plot_and_steps_beside_the_report(dry_run):
    report, out = dry_run[0], Path(dry_run[2])
    rl = next(r for r in report["stages"] if r["stage"] == "gpu_rl")
    import xarray as xr  # here, not at the top: the stage workers import this module (FAKES) within 2 s

    logs = [f"gpu_rl_{''.join(c if c.isalnum() else '_' for c in arm)}.nc" for arm in dry_plan().gpu_rl["arms"]]
    assert rl["files"] == [*logs, "gpu_rl_steps.csv", "gpu_rl.png"]
    for log in logs:  # each arm's every metric per step, as a run's metrics.nc holds them
        steps = xr.open_dataset(out / log)["step"].values.tolist()
        assert steps == list(range(dry_plan().gpu_rl["config"]["steps"]))
    assert (out / "gpu_rl.png").read_bytes().startswith(b"\x89PNG")
    rows = (out / "gpu_rl_steps.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * dry_plan().gpu_rl["config"]["steps"]  # header + each arm's steps
    assert "![gpu_rl.png](gpu_rl.png)" in (out / "report.md").read_text()


def test_dry_run_imports_nothing_the_card_lacks_beyond_the_carried_wheels(dry_run):
    """The import record of every stage against the card's packages: what is left must travel,
    and every carried wheel is used (pytest plugins are loaded by the gpu tests' own pytest)."""
    from importlib.metadata import entry_points

    imported = {wheels._norm(d) for r in dry_run[0]["stages"] for d in r["imports"]} - {"mismatch-lab"}
    carried = {wheels._norm(c) for c in wheels.CARRIED}
    assert imported - wheels.card_closure() <= wheels.carried_names()
    plugins = {wheels._norm(e.dist.name) for e in entry_points(group="pytest11")}
    assert carried - imported <= plugins


# ---------------------------------------------------------------- budgets and isolation


def fake_ok(plan, rec: Recorder) -> None:
    rec.put("x", 1.5)


def fake_attempts(plan, rec: Recorder) -> None:
    rec.attempt("part a", lambda: 1 / 0)
    rec.put("after part a", 3.0)


def fake_raises(plan, rec: Recorder) -> None:
    rec.put("before", 2.0)
    raise ValueError("boom")


def fake_crashes(plan, rec: Recorder) -> None:
    rec.put("before", 4.0)
    os._exit(7)


def fake_sleeps(plan, rec: Recorder) -> None:
    rec.put("started", 1.0)
    time.sleep(60)


FAKES = [Stage("ok", f"{__name__}:fake_ok", 30, "-"), Stage("attempts", f"{__name__}:fake_attempts", 30, "-"),
         Stage("raises", f"{__name__}:fake_raises", 30, "-"), Stage("crashes", f"{__name__}:fake_crashes", 30, "-"),
         Stage("sleeps", f"{__name__}:fake_sleeps", 1.5, "-"), Stage("after", f"{__name__}:fake_ok", 30, "-")]


def _run(tmp_path: Path, stages: list[Stage], total_s: float, registry: str = f"{__name__}:FAKES") -> dict:
    plan = tmp_path / "plan.json"
    dry_plan().to_json(plan)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return {r["stage"]: r for r in run_stages(stages, plan, tmp_path, total_s, env, registry, poll_s=0.05)}


def test_each_stage_is_isolated_and_keeps_its_numbers(tmp_path):
    t0 = time.monotonic()
    res = _run(tmp_path, FAKES, total_s=120)
    assert {n: r["status"] for n, r in res.items()} == {
        "ok": "ok", "attempts": "failed", "raises": "failed", "crashes": "crashed", "sleeps": "timeout", "after": "ok"}
    assert res["ok"]["metrics"] == {"x": 1.5} and res["after"]["metrics"] == {"x": 1.5}
    assert "ZeroDivisionError" in res["attempts"]["errors"]["part a"]
    assert res["attempts"]["metrics"] == {"after part a": 3.0}  # the stage went on after the failed part
    assert res["raises"]["metrics"] == {"before": 2.0} and "ValueError: boom" in res["raises"]["errors"]["stage"]
    assert res["crashes"]["metrics"] == {"before": 4.0} and "exit 7" in res["crashes"]["errors"]["stage"]
    assert res["sleeps"]["metrics"] == {"started": 1.0} and "budget" in res["sleeps"]["errors"]["stage"]
    assert 1.5 <= res["sleeps"]["seconds"] < 10
    assert time.monotonic() - t0 < 60  # the 60 s sleep was cut short
    assert all(r["budget_s"] == s.budget_s for s, r in zip(FAKES, res.values()))


def test_the_run_total_caps_every_stage_and_skips_what_is_left(tmp_path):
    slow = [Stage("sleeps", f"{__name__}:fake_sleeps", 30, "-"), Stage("ok", f"{__name__}:fake_ok", 30, "-")]
    res = _run(tmp_path, slow, total_s=2.0)
    assert res["sleeps"]["status"] == "timeout" and res["sleeps"]["seconds"] < 10
    assert res["ok"]["status"] == "not run" and "spent" in res["ok"]["errors"]["stage"]


def test_a_worker_that_cannot_start_marks_every_stage_not_run_with_its_log(tmp_path):
    res = _run(tmp_path, FAKES[:2], total_s=60, registry=f"{__name__}:NO_SUCH_LIST")
    for r in res.values():
        assert r["status"] == "not run"
        assert "NO_SUCH_LIST" in r["errors"]["stage"]  # the worker's own error, from its log


def test_results_left_by_an_earlier_run_are_not_taken_for_this_one(tmp_path):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "raises.json").write_text(json.dumps(
        {"stage": "raises", "status": "ok", "metrics": {"stale": 1}, "errors": {}, "started": 0}))
    res = _run(tmp_path, [FAKES[2]], total_s=60)
    assert res["raises"]["status"] == "failed" and "stale" not in res["raises"]["metrics"]


# ---------------------------------------------------------------- report


def _results() -> list[dict]:
    return [{"stage": "kernels", "status": "ok", "seconds": 12.34, "budget_s": 100, "proves": "p",
             "metrics": {"a|b": 1234.5678, "variant": "triton"}, "errors": {}},
            {"stage": "engine", "status": "failed", "seconds": 1.0, "budget_s": 60, "proves": "q", "metrics": {},
             "errors": {"stage": "Traceback (most recent call last):\n  File x\nNotImplementedError: CPU only"}}]


def test_fmt_keeps_four_significant_digits():
    assert fmt(1234.5678) == "1235" and fmt(0.000123456) == "0.0001235" and fmt(3) == "3" and fmt("x") == "x"


def test_summary_table_has_a_row_per_stage_with_the_exception_line():
    table = summary_table(_results()).splitlines()
    assert table[2] == "| kernels | ok | 12.3 | 100 | 2 |  |"
    assert table[3] == "| engine | failed | 1.0 | 60 | 0 | stage: NotImplementedError: CPU only |"


def test_report_files_hold_every_number_and_error(tmp_path):
    js, md = write_report(_results(), {"date": "d", "dry_run": False}, tmp_path)
    assert json.loads(js.read_text())["stages"] == _results()
    text = md.read_text()
    assert "| a\\|b | 1235 |" in text and "| variant | triton |" in text  # a | in a name stays in its cell
    assert "NotImplementedError: CPU only" in text and text.startswith("# GPU check\n")


def test_a_stage_file_lands_in_the_report_folder_and_is_linked_from_the_report(tmp_path):
    (tmp_path / "stages").mkdir()
    rec = Recorder(tmp_path / "stages" / "gpu_rl.json", "gpu_rl")
    rec.file("curves.png").write_bytes(b"png")
    rec.file("steps.csv").write_text("a\n")
    rec.finish()
    result = json.loads((tmp_path / "stages" / "gpu_rl.json").read_text())
    assert result["files"] == ["curves.png", "steps.csv"] and (tmp_path / "curves.png").is_file()
    text = write_report([{**result, "budget_s": 1, "proves": "p"}], {"dry_run": True}, tmp_path)[1].read_text()
    assert "![curves.png](curves.png)" in text and "[steps.csv](steps.csv)" in text


# ---------------------------------------------------------------- the RL arms' numbers


def _steps(rewards: list[float]) -> list[dict]:
    return [{"reward": r} for r in rewards]


def test_verdict_says_the_arms_differ_only_beyond_the_per_step_spread():
    from benchmarks.gpu_check.rl_stage import verdict

    apart = verdict({"grpo": _steps([0.2, 0.3, 0.2, 0.3]), "icepop": _steps([0.7, 0.8, 0.7, 0.8])}, window=4)
    assert apart.endswith("the arms differ beyond seed noise") and "icepop 0.750 vs grpo 0.250" in apart
    noisy = verdict({"grpo": _steps([0.0, 0.9, 0.1, 0.8]), "icepop": _steps([0.1, 1.0, 0.0, 0.9])}, window=4)
    assert noisy.endswith("the arms do not differ beyond seed noise")
    late = verdict({"grpo": _steps([0.9, 0.9, 0.2, 0.3]), "icepop": _steps([0.1, 0.1, 0.2, 0.3])}, window=2)
    assert late.startswith("final 2 steps") and late.endswith("do not differ beyond seed noise")  # window only


def test_routing_flips_count_expert_sets_not_their_order():
    import torch

    from benchmarks.gpu_check.rl_stage import routing_flips

    mine = [torch.tensor([[[1, 2]], [[3, 4]]]), torch.tensor([[[5, 6]]])]  # [len, layers=1, k=2] each
    same_sets = [torch.tensor([[[2, 1]], [[4, 3]]]), torch.tensor([[[6, 5]]])]
    one_flip = [torch.tensor([[[1, 2]], [[3, 7]]]), torch.tensor([[[5, 6]]])]
    assert routing_flips(mine, same_sets) == 0.0
    assert routing_flips(mine, one_flip) == pytest.approx(1 / 3)


# ---------------------------------------------------------------- what travels to the card


def test_carried_wheels_are_pinned_as_requirements_txt_pins_them():
    lines = set((REPO / "requirements.txt").read_text().splitlines())
    assert set(wheels.pins()) <= lines and len(wheels.pins()) == len(wheels.CARRIED)
    assert all(name and version.count(".") >= 1 for name, _, version in (a.partition("==") for a in wheels.ANCHORS))
    assert {"liger-kernel", "cut-cross-entropy"} <= wheels.carried_names()
    with pytest.raises(ValueError, match="not-a-package.*not pinned"):
        wheels.pins(("not-a-package",))


def test_install_puts_a_wheel_where_the_stages_import_it(tmp_path):
    src = tmp_path / "wheels"
    src.mkdir()
    assert wheels.install(src) is None  # nothing carried: nothing to do
    info = "demo_pkg-0.1.dist-info"
    with zipfile.ZipFile(src / "demo_pkg-0.1-py3-none-any.whl", "w") as whl:
        whl.writestr("demo_pkg/__init__.py", "ANSWER = 41 + 1\n")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 0.1\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    target = wheels.install(src)
    env = stage_env(dry=False, carried=target)
    out = subprocess.run([sys.executable, "-c", "import demo_pkg; print(demo_pkg.ANSWER)"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "42"


def test_stage_env_turns_the_interpreter_on_only_in_the_dry_run_and_points_at_the_carried_zoo(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    card = stage_env(dry=False, carried=tmp_path, zoo=tmp_path / "zoo")
    assert "TRITON_INTERPRET" not in card
    assert card["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(REPO), "/elsewhere"]
    assert card["MLAB_ZOO_DIR"] == str(tmp_path / "zoo")  # the zoo built for the card, when carried
    assert stage_env(dry=True, carried=None)["TRITON_INTERPRET"] == "1"


def test_pytest_log_outcomes_take_the_worst_phase_of_each_test():
    from benchmarks.gpu_check.pytest_log import outcomes

    lines = [json.dumps({"test": t, "when": w, "outcome": o}) for t, w, o in [
        ("a", "call", "passed"), ("b", "setup", "skipped"), ("c", "call", "failed"),
        ("d", "setup", "failed"), ("e", "call", "passed"), ("e", "teardown", "failed")]]
    assert outcomes(lines) == {"a": "passed", "b": "skipped", "c": "failed", "d": "error", "e": "error"}
