"""docs/integrations.md's complete TRL script, pasted into a new file and run as is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from aligntools.records import read
from minirl.training import run_log

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def test_trl_script_in_docs_runs(zoo, tmp_path):
    zoo("tiny-qwen3-moe")  # built once for the session; the script finds it through MLAB_ZOO_DIR
    script = next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "trainer.train()" in b)
    (tmp_path / "recipe.py").write_text(script)
    done = subprocess.run([sys.executable, "recipe.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(DOC.parents[1]), "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'mismatch/ratio/mean'" in done.stdout
    records = tmp_path / "runs/trl-attached/records"
    assert len(read(records / "step-000002.jsonl")) == 8
    assert "'mismatch/rel_l2/L0.attn_out'" in done.stdout  # the monitor read at step 2, the last step logged
    assert run_log.load(records / "metrics.nc")["monitor_step"].values.tolist() == [0, 2]
