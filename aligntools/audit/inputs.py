"""Semantic causes in what the two sides saw: the token/logprob alignment, the prompt, the weights.

Signatures:
- token_shift: the engine's logprob list is off by one against the tokens: engine[t] = model[t + s], s = +-1;
- prompt_mismatch: re-scored after a variant prompt (BOS dropped, BOS added, the chat template
  applied), the trainer reproduces the engine;
- stale_weights: re-scored with an older checkpoint (``--old``), the trainer reproduces the engine.
"""

from __future__ import annotations

import functools
from pathlib import Path

from torch import nn

from aligntools.audit.registry import Fit, register_cause
from aligntools.audit.state import Context, State, gap

SHIFTS = (1, -1)


@register_cause("token_shift")
def token_shift(ctx: Context, state: State) -> Fit | None:
    """The logprob of token t+s recorded at t (s = +1: the list starts one token late, e.g. the prompt's
    last logprob dropped twice; s = -1: a leading prompt logprob kept)."""
    s = min(SHIFTS, key=lambda s: gap(ctx, state.with_shift(s)))
    fix = (f"the records' logprobs[t] belong to completion token t{s:+d}: align the engine's logprob list with "
           "completion_ids (drop or keep the prompt's last logprob consistently)")
    return Fit("token_shift", s, "shift", lambda c, st: st.with_shift(s), fix)


def _variants(ctx: Context) -> dict[str, list[list[int]]]:
    """Prompts the engine may have seen instead of the recorded ones, by name."""
    bos = getattr(getattr(ctx.model, "config", None), "bos_token_id", None)
    prompts = [list(r.prompt_ids) for r in ctx.records]
    out = {}
    if bos is not None and all(p[0] == bos and len(p) > 1 for p in prompts):
        out["bos_dropped"] = [p[1:] for p in prompts]
    if bos is not None and any(p[0] != bos for p in prompts):
        out["bos_added"] = [p if p[0] == bos else [bos, *p] for p in prompts]
    template = _chat_template(ctx, prompts)
    if template is not None:
        out["chat_template"] = template
    return out


def _chat_template(ctx: Context, prompts: list[list[int]]) -> list[list[int]] | None:
    """The prompts with the model's chat template applied (the engine templated, the trainer did not)."""
    path = getattr(ctx.model, "name_or_path", None)
    if not path or not (Path(path) / "tokenizer_config.json").is_file():
        return None
    files = sorted([*Path(path).glob("tokenizer*"), *Path(path).glob("chat_template*")])
    stamp = tuple((f.name, f.stat().st_mtime_ns) for f in files)
    tok = _tokenizer(str(path), stamp)
    if not getattr(tok, "chat_template", None):
        return None
    return [list(tok.apply_chat_template([{"role": "user", "content": tok.decode(p, skip_special_tokens=True)}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False))
            for p in prompts]


@functools.lru_cache(maxsize=2)
def _tokenizer(path: str, stamp: tuple) -> object:
    """The checkpoint's tokenizer, loaded once per process and version of its files (``stamp``: their names
    and mtimes): Gemma 3's is a 33 MB JSON that took 3 s to parse, and the cause asks for it in every round
    of causes (read only: the template is applied, nothing is set)."""
    import transformers

    return transformers.AutoTokenizer.from_pretrained(path)


@register_cause("prompt_mismatch")
def prompt_mismatch(ctx: Context, state: State) -> Fit | None:
    """Re-score after each variant prompt; the best one is the prompt the engine saw."""
    logits = {name: ctx.rescore(f"prompt:{name}", prompts) for name, prompts in _variants(ctx).items()}
    if not logits:
        return None
    name = min(logits, key=lambda n: gap(ctx, state.with_logits(logits[n])))
    fixes = {"bos_dropped": "the engine saw the prompt without its BOS token: tokenize the engine's prompt with "
                            "add_special_tokens=True, or record the ids the engine was given",
             "bos_added": "the engine prepended a BOS the recorded prompt lacks: record the engine's prompt_token_ids, "
                          "or add BOS on the trainer's side",
             "chat_template": "the engine applied the chat template and the trainer did not: record the templated "
                              "prompt ids, or apply the same template before scoring"}
    return Fit("prompt_mismatch", name, "prompt",
               lambda c, s: s.with_logits(c.rescore(f"prompt:{name}", _variants(c)[name])), fixes[name])


@register_cause("stale_weights")
def stale_weights(ctx: Context, state: State) -> Fit | None:
    """Re-score with each candidate old checkpoint; the best one is what the engine served."""
    if not ctx.old:
        return None
    from aligntools.audit.score import load_model

    prompts = [r.prompt_ids for r in ctx.records]
    names = [f"old[{i}]" if isinstance(old, nn.Module) else str(old) for i, old in enumerate(ctx.old)]
    loads = {name: (lambda old=old: load_model(old)) for name, old in zip(names, ctx.old)}
    logits = {name: ctx.rescore(f"old:{name}", prompts, load=load) for name, load in loads.items()}
    path = min(logits, key=lambda n: gap(ctx, state.with_logits(logits[n])))
    fix = (f"the engine served {path}, not the trainer's weights: sync weights before each rollout (check the "
           "weight version the engine reports against the trainer's step)")
    return Fit("stale_weights", path, "checkpoint", lambda c, s: s.with_logits(
        c.rescore(f"old:{path}", [r.prompt_ids for r in c.records], load=loads[path])), fix)
