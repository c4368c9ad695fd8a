"""``make workshop``: build every checkpoint the notebooks use, before the room opens them.

Why: the notebooks build what they need on first use, so on a fresh laptop notebook 02 first trains
``tiny-qwen3-moe`` (about 100 s on a 2-core AVX2 box) and notebook 04 its task SFT (about 150 s more),
while the attendee waits. A host runs this once per machine (or per shared ``MLAB_ZOO_DIR``)
beforehand; each step is the very call a notebook makes, so a notebook then finds its checkpoint
cached (same name, seed and fingerprint) and runs at its README "warm" time.

``python -m labs.workshop`` draws one bar over the checkpoints, then prints each one's time and the
notebooks that use it, and says when the room is ready.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from labs import zoo
from minirl.quiet import quiet, quiet_when_asked


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint the notebooks use: its label, which notebooks need it, and the call that builds it."""

    label: str
    notebooks: tuple[str, ...]
    build: Callable[[], Path]


def _sft(model: str, task: str, task_kwargs: dict, sft_steps: int) -> Path:
    """The warm-up ``minirl.train`` runs first (``resolve_model``), with the labs' seed 0: same fingerprint,
    same cache entry as the notebook's run."""
    from minirl.training.train_config import TrainConfig
    from minirl.training.trainer import resolve_model

    return resolve_model(TrainConfig(model=str(zoo.build(model, progress=False)), task=task, task_kwargs=task_kwargs,
                                     sft_steps=sft_steps, seed=0, progress=False))


def _async_sft() -> Path:
    """Notebook 09's warm-up, from ``async_lab.config`` itself (its out_dir is never written by a warm-up)."""
    from labs import async_lab
    from minirl.training.trainer import resolve_model

    with tempfile.TemporaryDirectory() as out:
        return resolve_model(async_lab.config(1, out))


CHECKPOINTS: tuple[Checkpoint, ...] = (
    Checkpoint("tiny-qwen3-moe", ("00", "01", "02", "03", "04", "11", "12"),
               lambda: zoo.build("tiny-qwen3-moe", progress=False)),
    Checkpoint("tiny-qwen3", ("05", "07", "09", "10", "12"), lambda: zoo.build("tiny-qwen3", progress=False)),
    # icepop_lab.train_arms / masked_share_sweep and 04 §4's monitor runs: TrainConfig's arithmetic defaults;
    # also on_policy_lab.policy("tiny-qwen3-moe") (notebook 12's lr0 section): the same cache entry
    Checkpoint("tiny-qwen3-moe + arithmetic SFT", ("04", "12"),
               lambda: _sft("tiny-qwen3-moe", "arithmetic", {"digits": 1}, 100)),
    # on_policy_lab.policy("tiny-qwen3"), notebook 12's on-policy section
    Checkpoint("tiny-qwen3 + arithmetic SFT (12)", ("12",), lambda: _sft("tiny-qwen3", "arithmetic", {"digits": 1}, 100)),
    # c3po_lab.compare_training at notebook 05's default size (max_length=24, p=0.15)
    Checkpoint("tiny-qwen3 + longtail_sorting SFT (05)", ("05",),
               lambda: _sft("tiny-qwen3", "longtail_sorting", {"max_length": 24, "p": 0.15}, 150)),
    Checkpoint("tiny-qwen3 + longtail_sorting SFT (09)", ("09",), _async_sft),
)
"""Every checkpoint a notebook builds at its default size, in build order (a base before its SFT)."""


@quiet_when_asked
def prepare(checkpoints: tuple[Checkpoint, ...] = CHECKPOINTS, progress: bool = True) -> dict[str, float]:
    """Build each checkpoint (a cached one takes about a second); return seconds per label."""
    seconds = {}
    bar = tqdm(checkpoints, desc="workshop", unit="checkpoint", disable=not progress)
    for ck in bar:
        bar.set_postfix_str(ck.label)
        t = time.perf_counter()
        with quiet(progress=False):  # the loaders' own bars would break the one bar over the room's checkpoints
            ck.build()
        seconds[ck.label] = time.perf_counter() - t
    bar.close()
    return seconds


def ready_message(seconds: dict[str, float], checkpoints: tuple[Checkpoint, ...] = CHECKPOINTS) -> str:
    """Per checkpoint its time and notebooks, then the total and the line the host waits for."""
    lines = [f"  {s:6.0f} s  {ck.label}  (notebooks {', '.join(ck.notebooks)})"
             for ck in checkpoints if ck.label in seconds for s in (seconds[ck.label],)]
    total = sum(seconds.values())
    return "\n".join([*lines, f"The room is ready: {len(seconds)} checkpoints in {total:.0f} s under "
                      f"{zoo.default_root()}. Next: `make lab`."])


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    print(ready_message(prepare()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
