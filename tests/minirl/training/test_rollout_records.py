"""``record_rollouts``: a minirl run's rollouts as audit records, read by ``aligntools.records.read``,
written whole, claimed by the run, and audited as their engine deserves (aligned / numeric).

The one test that imports both packages on purpose: minirl writes the record format without
aligntools (docs/architecture.md), so only a reader on the other side proves the format is right."""

from __future__ import annotations

import json
import os

import pytest
import torch

import aligntools
from aligntools.records import read
from minirl.driver import train
from minirl.engine.rollout import Rollout
from minirl.training import rollout_records, run_dir
from minirl.training.train_config import TrainConfig


def _config(model, tmp_path, **changes) -> TrainConfig:
    base = dict(model=str(model), sft_steps=0, n_train=8, n_eval=0, prompts_per_step=2, group_size=2, max_new_tokens=6,
                steps=2, eval_every=0, checkpoint_every=0, out_dir=str(tmp_path / "run"), progress=False,
                record_rollouts=True)
    return TrainConfig(**{**base, **changes})


def test_a_record_with_experts_reads_back_field_for_field(tmp_path):
    """Prompt 3 + completion 2 tokens: routed experts are the prompt's rows then the completion's."""
    r = Rollout([1, 5, 7], [9, 2], torch.tensor([-0.25, -1.5]), "stop", routed_experts=torch.tensor([[[3, 1]], [[0, 2]]]),
                prompt_routed_experts=torch.zeros(3, 1, 2, dtype=torch.long))  # [P, layers, top_k], [T, ...]
    path = rollout_records.write(tmp_path, 4, [r, r], rollout_records.sampling(0.7))
    (got, _) = read(path)
    assert (got.prompt_ids, got.completion_ids, got.logprobs, got.step) == ((1, 5, 7), (9, 2), (-0.25, -1.5), 4)
    assert got.sampling == {"temperature": 0.7, "top_p": 1.0, "top_k": 0.0} and got.logprobs_mode == "raw"
    assert got.routed_experts.tolist() == [[[0, 0]]] * 3 + [[[3, 1]], [[0, 2]]]
    assert path.name == "step-000004.jsonl" and not (tmp_path / rollout_records.TMP).exists()


def test_a_write_killed_before_its_rename_leaves_the_previous_file_whole(tmp_path, monkeypatch):
    r = Rollout([1], [2], torch.tensor([-0.5]), "length")
    path = rollout_records.write(tmp_path, 0, [r], rollout_records.sampling(1.0))
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))  # killed there
    with pytest.raises(KeyboardInterrupt):
        rollout_records.write(tmp_path, 0, [r, r], rollout_records.sampling(1.0))
    assert path.read_bytes() == before and len(read(path)) == 1


@pytest.mark.parametrize("engine, verdict", [("minirl:aligned", "aligned"), ("minirl:typical", "numeric")])
def test_a_run_records_each_step_and_the_audit_names_its_engine(zoo, tmp_path, engine, verdict):
    """2 steps of tiny-llama; step 0 was sampled with the starting weights, so it audits against them:
    the fp32 aligned engine is within the noise floor, the bf16 one is numeric."""
    model = zoo("tiny-llama")
    result = train(_config(model, tmp_path, engine=engine))
    files = sorted((result.out_dir / "rollouts").iterdir())
    assert [f.name for f in files] == ["step-000000.jsonl", "step-000001.jsonl"]
    records = [read(f) for f in files]
    assert [len(r) for r in records] == [4, 4] and {r.step for r in records[1]} == {1}
    manifest = json.loads((result.out_dir / run_dir.MANIFEST).read_text())["files"]
    assert {"rollouts/step-000000.jsonl", "rollouts/step-000001.jsonl", rollout_records.TMP} <= set(manifest)
    audit = aligntools.audit(records[0], model)
    assert (audit.verdict if verdict == "aligned" else audit.causes[0].name) == verdict, audit.summary()


def test_a_step_file_no_run_wrote_is_refused(zoo, tmp_path):
    out = tmp_path / "run" / "rollouts"
    out.mkdir(parents=True)
    (out / "step-000000.jsonl").write_text("mine\n")
    with pytest.raises(run_dir.RunDirError, match="no run here wrote it"):
        train(_config(zoo("tiny-llama"), tmp_path, steps=1))
    assert (out / "step-000000.jsonl").read_text() == "mine\n"


def test_async_and_tool_runs_refuse_it(zoo, tmp_path):
    with pytest.raises(ValueError, match="record_rollouts with mode: async"):
        _config(zoo("tiny-llama"), tmp_path, mode="async")


def test_overwrite_removes_the_step_files_and_their_folder(tmp_path):
    """The step files are the run's (claimed in its manifest): a new run over it removes them, then rollouts/."""
    r = Rollout([1], [2], torch.tensor([-0.5]), "length")
    first = run_dir.RunDir.open(tmp_path, resume=False)
    first.start()
    rollout_records.save(first, 0, [r], 1.0)
    first.close()
    again = run_dir.RunDir.open(tmp_path, resume=False, overwrite=True)
    again.start()
    again.close()
    assert not (tmp_path / "rollouts").exists()
