"""Reading records: every format from its content, the same records out, bad input named, no code run."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

from aligntools.records import Record, RecordError, read, write_jsonl

EXPERTS = np.arange(5 * 2 * 2).reshape(5, 2, 2) % 7  # [prompt 3 + completion 3 - 1 tokens, layers, top_k]
RECORD = Record((1, 5, 9), (7, 8, 4), (-0.5, -1.25, -0.125), routed_experts=EXPERTS)


def _same(got: list[Record], want: Record = RECORD) -> None:
    assert len(got) == 1
    r = got[0]
    assert (r.prompt_ids, r.completion_ids, r.logprobs) == (want.prompt_ids, want.completion_ids, want.logprobs)
    assert len(r.routed_experts) - len(want.routed_experts) in (0, 1)  # verl keeps the last token's row
    assert np.array_equal(r.routed_experts[: len(want.routed_experts)], want.routed_experts)


def _slime(path):  # slime's save_debug_rollout_data: torch.save({"rollout_id", "samples": [Sample.to_dict()]})
    sample = {"tokens": [1, 5, 9, 7, 8, 4], "response_length": 3, "rollout_log_probs": [-0.5, -1.25, -0.125],
              "rollout_routed_experts": EXPERTS.astype(np.int32), "status": "completed", "loss_mask": [1, 1, 1],
              "spec_info": {"spec_accept_token_num": 0}, "metadata": {}, "reward": 1.0, "weight_versions": ["3"]}
    torch.save({"rollout_id": 3, "samples": [sample]}, path)


def _verl(path, save):  # left-padded prompts, right-padded responses, experts over prompt + response
    experts = np.zeros((1, 8, 2, 2), dtype=np.int64)
    experts[0, 1:6] = EXPERTS
    batch = {"prompts": np.array([[0, 1, 5, 9]]), "responses": np.array([[7, 8, 4, 0]]),
             "attention_mask": np.array([[0, 1, 1, 1, 1, 1, 1, 0]]), "response_mask": np.array([[1, 1, 1, 0]]),
             "rollout_log_probs": np.array([[-0.5, -1.25, -0.125, 0.0]], dtype=np.float32),
             "routed_experts": experts}
    save(path, batch)


def _vllm(path):
    out = {"token_ids": [7, 8, 4], "routed_experts": EXPERTS.tolist(),
           "logprobs": [{"7": {"logprob": -0.5, "rank": 1}}, {"8": {"logprob": -1.25}, "3": {"logprob": -0.9}},
                        {"4": -0.125}]}
    path.write_text(json.dumps([{"prompt_token_ids": [1, 5, 9], "outputs": [out]}]))


def _sglang(path):
    meta = {"output_token_logprobs": [[-0.5, 7, None], [-1.25, 8, None], [-0.125, 4, None]],
            "input_token_logprobs": [[None, 1, None], [-3.0, 5, None], [-2.0, 9, None]],
            "routed_experts": EXPERTS.tolist()}
    path.write_text(json.dumps([{"text": "x", "output_ids": [7, 8, 4], "meta_info": meta}]))


WRITERS = {
    "records.jsonl": lambda p: write_jsonl([RECORD], p),
    "slime_debug.pt": _slime,
    "verl.npz": lambda p: _verl(p, lambda path, b: np.savez(path, **b)),
    "verl.pt": lambda p: _verl(p, lambda path, b: torch.save({k: torch.as_tensor(v) for k, v in b.items()}, path)),
    "verl.safetensors": lambda p: _verl(p, lambda path, b: __import__("safetensors.torch").torch.save_file(
        {k: torch.as_tensor(v) for k, v in b.items()}, str(path))),
    "vllm.json": _vllm,
    "sglang.json": _sglang,
}


@pytest.mark.parametrize("name", WRITERS)
def test_every_format_reads_to_the_same_record(tmp_path, name):
    path = tmp_path / "dump.bin"  # the format is told by the content, not the suffix
    WRITERS[name](path if not name.endswith(".npz") else tmp_path / "dump.npz")
    got = read(path if not name.endswith(".npz") else tmp_path / "dump.npz")
    _same(got)
    if name == "slime_debug.pt":
        assert got[0].step == 3


class _Exploit:
    """Unpickling this runs ``exec`` with code that writes a file: a loader that builds it ran the file's code."""

    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return exec, (f"open({str(self.sentinel)!r}, 'w').write('ran')",)


@pytest.mark.parametrize("save", [torch.save, lambda obj, path: path.write_bytes(pickle.dumps(obj))],
                         ids=["torch.save", "pickle"])
def test_code_executing_pickle_is_refused_by_name_and_never_run(tmp_path, save):
    sentinel = tmp_path / "pwned"
    save({"samples": [_Exploit(sentinel)]}, tmp_path / "evil.pt")
    with pytest.raises(RecordError, match=r"refusing to load it: it names builtins\.exec"):
        read(tmp_path / "evil.pt")
    assert not sentinel.exists()


@pytest.mark.parametrize("entry,message", [
    ({"prompt_ids": [1], "completion_ids": [2, 3]}, "entry 0: missing logprobs"),
    ({"prompt_ids": [1], "completion_ids": [2, 3], "logprobs": [-1.0]}, "1 values for 2 completion tokens"),
    ({"prompt_ids": [1], "completion_ids": [2], "logprobs": [0.7]}, "a logprob is a number <= 0"),
    ({"prompt_ids": [1.5], "completion_ids": [2], "logprobs": [-1.0]}, "prompt_ids: position 0 is 1.5"),
    ({"prompt_ids": [1], "completion_ids": [2], "logprobs": [-1.0], "sampling": {"temp": 1}}, "unknown key(s) temp"),
    ({"prompt_ids": [1], "completion_ids": [2], "logprobs": [-1.0], "logprobs_mode": "cooked"}, "use 'raw'"),
    ({"prompt_ids": [1], "completion_ids": [2], "logprobs": [-1.0], "routed_experts": [[[0]]] * 5}, "5 rows for 2"),
    ({"prompt_ids": [1], "completion_ids": [2], "logprobs": [-1.0], "extra": 1}, "unknown field(s) extra"),
])
def test_bad_entries_name_file_entry_and_fix(tmp_path, entry, message):
    path = tmp_path / "r.json"
    path.write_text(json.dumps([entry]))
    with pytest.raises(RecordError) as e:
        read(path)
    assert str(e.value).startswith(f"{path}: entry 0") and message in str(e.value)


@pytest.mark.parametrize("content,message", [
    (b"", "holds no records"),
    (b'{"prompt_ids": [1]}\n{"oops"\n', "line 1: missing completion_ids"),
    (b"\xff\xfe\x00garbage", "not a known records format"),
    (b"PAR1....", "parquet"),  # unreadable, or pyarrow missing: either way the message says parquet
])
def test_unreadable_files_say_why(tmp_path, content, message):
    path = tmp_path / "r"
    path.write_bytes(content)
    with pytest.raises(RecordError, match=message.replace("(", r"\(")):
        read(path)


def test_parquet_records_read_back(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist([RECORD.to_json()]), tmp_path / "r.parquet")
    _same(read(tmp_path / "r.parquet"))


def test_missing_file_is_a_record_error(tmp_path):
    with pytest.raises(RecordError, match="no such file"):
        read(tmp_path / os.sep.join(["nope", "r.jsonl"]))


def test_a_folder_reads_its_records_files_in_step_order(tmp_path):
    """A run's records folder (TRL's attachment, slime, verl dump one file per step): every records
    file in step order, step-2 before step-10; the run log and hidden temporaries are not read."""
    for step in (10, 2):
        write_jsonl([Record((1, step), (7,), (-0.5,), step=step)], tmp_path / f"step-{step}.jsonl")
    (tmp_path / "metrics.nc").write_bytes(b"\x89HDF\r\n")
    (tmp_path / ".step-11.jsonl.tmp").write_text("{half a line")
    (tmp_path / ".step-12.jsonl").write_text("{half a line")
    assert [r.step for r in read(tmp_path)] == [2, 10]


def test_a_folder_without_records_or_with_a_fifo_is_refused_by_name(tmp_path):
    (tmp_path / "metrics.nc").write_bytes(b"x")
    with pytest.raises(RecordError, match=r"a folder with no records file .*\*\.jsonl"):
        read(tmp_path)
    os.mkfifo(tmp_path / "step-1.jsonl")
    with pytest.raises(RecordError, match=r"step-1\.jsonl: not a regular file"):
        read(tmp_path)
