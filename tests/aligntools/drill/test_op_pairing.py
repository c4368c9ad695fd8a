"""The recorder and the op rule on plain torch functions (no model): which ops pair, which
jumps, and a run of unpaired ops named when the error enters there."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from aligntools.analyzer.tolerance import Tolerance
from aligntools.drilldown.pairing import analyse, line_up, rel_l2
from aligntools.drilldown.record import OpRecorder
from aligntools.drilldown.roles import KNOBS, role_of_stack

SEQ = 6
LIMIT = Tolerance().limit("L0.attn_out", "float32")
torch.manual_seed(0)
X, W = torch.randn(1, SEQ, 16), torch.randn(8, 16)
TABLE = torch.randn(SEQ, 8)


def record(fn, x: torch.Tensor = X) -> OpRecorder:
    rec = OpRecorder(SEQ)
    with torch.no_grad(), rec:
        rec.open(x)
        out = fn(x)
        rec.close(out)
    return rec


def drilled(fn_a, fn_b):
    a, b = record(fn_a), record(fn_b)
    return analyse(line_up(a.ops, b.ops), rel_l2(a.input, b.input), LIMIT)


def attention_scores(x, softmax_dtype=torch.float32):
    return F.softmax((x @ W.T).to(softmax_dtype), dim=-1).float() * 2


def test_a_cast_is_the_precision_of_the_op_that_reads_it():
    table, first = drilled(attention_scores, lambda x: attention_scores(x, torch.bfloat16))
    assert (first.op, first.role, first.unpaired) == ("softmax", "attention", False)
    assert first.input_error == 0 and first.error > LIMIT
    assert table.loc[first.row, "dtype_infer"] == "bfloat16"  # the softmax read a bf16 copy
    assert list(table["op"]) == ["gemm", "softmax", "mul", "output"]  # the casts are no ops


def test_identical_functions_have_no_divergence():
    table, first = drilled(attention_scores, attention_scores)
    assert first is None and (table["error"] == 0).all()


def apply_rope(x, table):
    return x * table


def test_error_entering_in_unpaired_ops_names_them_not_the_next_op():
    """Side b runs its 'rope' on a wider tensor (q and k together): nothing pairs with it, and
    the first paired op after it sees the error arrive with its inputs."""
    def side_a(x):
        return F.softmax(apply_rope(x @ W.T, TABLE), dim=-1)

    def side_b(x):
        h = x @ W.T
        both = apply_rope(torch.cat([h, h], dim=-1), TABLE.bfloat16().float().repeat(1, 2))
        return F.softmax(both[..., :8], dim=-1)

    table, first = drilled(side_a, side_b)
    assert first.unpaired and first.role == "rope" and first.knob == "rope, rope_cache_dtype"
    assert set(table.loc[table["jumps"], "role"]) == {"rope"}
    assert table.loc[table["op"] == "softmax", "jumps"].tolist() == [False]  # its inputs carried it


def test_token_slot_rows_never_pair():
    """[S*k, ...] rows are in an order each engine picks: comparing them would be noise."""
    a = record(lambda x: x[0].repeat_interleave(2, dim=0) * 3)  # [S*2, D], token-major
    b = record(lambda x: x[0].repeat(2, 1) * 3)  # [S*2, D], slot-major
    rows = line_up(a.ops, b.ops)
    assert len(rows) == 4 and all(p is None or q is None for p, q in rows)  # mul and output, each side alone


def test_role_comes_from_the_innermost_function_that_names_one():
    def eager_attention_forward():
        def rmsnorm():
            return role_of_stack(__import__("sys")._getframe())
        return rmsnorm(), role_of_stack(__import__("sys")._getframe())

    assert eager_attention_forward() == ("rmsnorm", "attention")


def test_every_knob_named_is_a_minirl_knob():
    from minirl import Knobs

    fields = {f.name for f in dataclasses.fields(Knobs)}
    named = {k for knobs in KNOBS.values() for k in knobs}
    assert named <= fields, named - fields


@pytest.mark.parametrize("site", ["L0.attn_norm", "logits", "L0.resid_post", "embed"])
def test_sites_outside_a_layer_module_are_refused_before_any_model_loads(site, tmp_path):
    import aligntools

    with pytest.raises(ValueError, match="attention or MLP/MoE module"):
        aligntools.drill(tmp_path / "no-model", site)


@pytest.mark.parametrize("ids", [torch.zeros(2, 8, dtype=torch.long), torch.zeros(1, 8),
                                 torch.zeros(1, 1, dtype=torch.long)])
def test_ids_must_be_one_sequence_of_token_ids(moe, ids):
    import aligntools
    from aligntools.gates.inputs import UsageError

    with pytest.raises(UsageError, match="one sequence"):
        aligntools.drill(moe, "L0.attn_out", ids=ids)


def test_vllm_is_refused_with_a_usage_error(moe):
    import aligntools
    from aligntools.gates.inputs import UsageError

    with pytest.raises(UsageError, match=r"not vllm.s ops yet; aligntools.fingerprint\(capture, model\) names the minirl knobs"):
        aligntools.drill(moe, "L0.attn_out", infer="vllm")
