"""Framework shapes -> record fields: vLLM ``RequestOutput``, SGLang results, slime/Miles samples,
verl batches.

Why here and not in the frameworks: the audit must read a dump on a machine without them (a CPU box
with no vLLM, slime or verl installed), so each shape is read from its plain fields, as the
framework serialises them, and mapped onto the documented record (``record.validate`` then checks it).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from aligntools.records.record import Record, RecordError, validate

PASS_THROUGH = ("sampling", "logprobs_mode", "step")
"""Record fields a framework entry may carry beside its own (a user adding the sampling settings)."""


def entry_kind(entry: object) -> str:
    """Which shape a JSON/pickled entry has: record, vllm, sglang or slime."""
    if isinstance(entry, Mapping):
        if "completion_ids" in entry:
            return "record"
        if "outputs" in entry and "prompt_token_ids" in entry:
            return "vllm"
        if "meta_info" in entry:
            return "sglang"
        if "tokens" in entry and "response_length" in entry:
            return "slime"
    return "record"  # validate() names what is missing


def from_entry(entry: object, where: str, step: int | str | None = None) -> list[Record]:
    """The records of one entry (a vLLM request with n outputs gives n)."""
    kind = entry_kind(entry)
    if kind == "vllm":
        return [validate(fields, f"{where} output {j}") for j, fields in enumerate(_vllm(entry, where))]
    fields = {"sglang": _sglang, "slime": _slime}.get(kind, lambda e, w: e)(entry, where)
    if step is not None and isinstance(fields, Mapping) and "step" not in fields:
        fields = {**fields, "step": step}
    return [validate(fields, where)]


def _extra(entry: Mapping) -> dict:
    return {k: entry[k] for k in PASS_THROUGH if k in entry}


def _vllm(entry: Mapping, where: str) -> list[dict]:
    outs = entry["outputs"]
    if not isinstance(outs, list) or not outs:
        raise RecordError(f"{where}: vLLM request has no outputs; dump RequestOutput.outputs (each with token_ids "
                          "and logprobs, from SamplingParams(logprobs=0))")
    fields = []
    for j, out in enumerate(outs):
        if not isinstance(out, Mapping) or out.get("logprobs") is None:
            raise RecordError(f"{where} output {j}: no logprobs; sample with SamplingParams(logprobs=0) "
                              "so vLLM returns the sampled token's logprob")
        ids = list(out.get("token_ids", []))
        logprobs = [_sampled_logprob(pos, tok, f"{where} output {j} position {i}")
                    for i, (pos, tok) in enumerate(zip(out["logprobs"], ids))]
        f = {"prompt_ids": entry["prompt_token_ids"], "completion_ids": ids, "logprobs": logprobs, **_extra(entry)}
        if out.get("routed_experts") is not None:
            f["routed_experts"] = out["routed_experts"]
        fields.append(f)
    return fields


def _sampled_logprob(position: object, token: int, where: str) -> object:
    """vLLM's per-position logprobs: ``{token_id: Logprob | float}`` (JSON keys are strings), or a float."""
    if not isinstance(position, Mapping):
        return position
    value = position.get(token, position.get(str(token)))
    if value is None:
        raise RecordError(f"{where}: the sampled token {token} is not among the returned logprobs; "
                          "vLLM always returns it with SamplingParams(logprobs=k)")
    return value.get("logprob") if isinstance(value, Mapping) else value


def _sglang(entry: Mapping, where: str) -> dict:
    meta = entry["meta_info"]
    out_lp = meta.get("output_token_logprobs") if isinstance(meta, Mapping) else None
    if not out_lp:
        raise RecordError(f"{where}: SGLang result without meta_info.output_token_logprobs; "
                          "generate with return_logprob=True")
    prompt = entry.get("input_ids")
    if prompt is None and meta.get("input_token_logprobs"):
        prompt = [row[1] for row in meta["input_token_logprobs"]]
    if prompt is None:
        raise RecordError(f"{where}: SGLang result has no prompt ids; add 'input_ids' to each result or generate "
                          "with return_logprob=True, logprob_start_len=0 (meta_info.input_token_logprobs)")
    f = {"prompt_ids": prompt, "completion_ids": entry.get("output_ids", [row[1] for row in out_lp]),
         "logprobs": [row[0] for row in out_lp], **_extra(entry)}
    if meta.get("routed_experts") is not None:
        f["routed_experts"] = meta["routed_experts"]
    return f


def _slime(entry: Mapping, where: str) -> dict:
    """slime/Miles ``Sample.to_dict()``: ``tokens`` = prompt + response, the response the last
    ``response_length`` of them, ``rollout_routed_experts`` one row per token but the last."""
    tokens, n = list(entry["tokens"]), entry["response_length"]
    if entry.get("rollout_log_probs") is None:
        raise RecordError(f"{where}: slime sample without rollout_log_probs; run with the rollout logprobs kept "
                          "(--use-rollout-logprobs or a TIS/MIS correction)")
    if not isinstance(n, int) or not 0 < n < len(tokens):
        raise RecordError(f"{where}: response_length {n!r} for {len(tokens)} tokens; expected 0 < n < len(tokens)")
    mask = entry.get("loss_mask")
    if mask is not None and not all(mask):
        raise RecordError(f"{where}: loss_mask has zeros (tool or environment tokens the engine did not sample); "
                          "the audit reads single-turn samples: drop those samples or split them into turns")
    f = {"prompt_ids": tokens[:-n], "completion_ids": tokens[-n:], "logprobs": list(entry["rollout_log_probs"])}
    if entry.get("rollout_routed_experts") is not None:
        f["routed_experts"] = entry["rollout_routed_experts"]
    return f


def from_verl(batch: Mapping, source: str) -> list[Record]:
    """A verl batch (``DataProto.batch`` as a dict): ``prompts`` [B, P] left-padded, ``responses``
    [B, R] right-padded, ``attention_mask`` [B, P + R], ``response_mask`` [B, R],
    ``rollout_log_probs`` [B, R], optional ``routed_experts`` [B, P + R, layers, top_k]."""
    need = ("prompts", "responses", "attention_mask", "rollout_log_probs")
    missing = [k for k in need if k not in batch]
    if missing:
        raise RecordError(f"{source}: verl batch without {', '.join(missing)}; save batch.batch.to_dict() of a step "
                          "that kept rollout_log_probs (rollout.calculate_log_probs=True)")
    arr = {k: _numpy(v) for k, v in batch.items()}
    prompts, responses, attn = arr["prompts"], arr["responses"], arr["attention_mask"].astype(bool)
    p_len = prompts.shape[1]
    resp_mask = arr["response_mask"].astype(bool) if "response_mask" in arr else attn[:, p_len:]
    records = []
    for b in range(responses.shape[0]):
        where = f"{source}: sample {b}"
        n = int(resp_mask[b].sum())
        if not resp_mask[b, :n].all():
            raise RecordError(f"{where}: response_mask has holes (multi-turn tool tokens); the audit reads "
                              "single-turn samples: drop those samples")
        keep = np.concatenate([attn[b, :p_len], resp_mask[b]])
        fields = {"prompt_ids": prompts[b][attn[b, :p_len]].tolist(), "completion_ids": responses[b, :n].tolist(),
                  "logprobs": arr["rollout_log_probs"][b, :n].tolist()}
        if "routed_experts" in arr:
            fields["routed_experts"] = arr["routed_experts"][b][keep]
        records.append(validate(fields, where))
    return records


def _numpy(value: object) -> np.ndarray:
    """A tensor (bf16 included, which numpy lacks: read as float64) or array as numpy."""
    if hasattr(value, "detach"):
        value = value.detach()
        return (value.double() if value.is_floating_point() else value).numpy()
    return np.asarray(value)
