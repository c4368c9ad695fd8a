"""``make demo``: the main job on the embedded default model (no downloads).

Builds the tiny Qwen3-MoE zoo checkpoint and runs the alignment check of a typical bf16
inference engine against the float32 training engine (see README "Main job").
"""

from __future__ import annotations

import json
import sys

from labs import zoo


def main() -> int:
    path = zoo.build("tiny-qwen3-moe")
    meta = json.loads((path / "zoo.json").read_text())
    print(f"built {meta['name']} at {path}: {meta['description']}, {meta['n_params']:,} params, "
          f"train loss {meta['final_train_loss']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
