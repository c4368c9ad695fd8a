"""The minirl engine vs transformers on the same zoo checkpoints: throughput and mismatch.

Throughput (default), one run, same model, dtype and prompts on both sides:
decode = ``generate`` of ``--batch`` sequences x ``--new-tokens`` tokens (sampling at T=1, EOS
ignored so every sequence runs to the end, KV cache on both sides, each side in its best
configuration: transformers with its default sdpa attention and grouped_mm experts, both under
``torch.inference_mode``), generated tokens per wall
second, prefill included on both sides; prefill = one full forward over ``--batch`` x
``--prefill-len`` tokens (``Engine.score`` vs the HF forward + log_softmax), tokens per second.
Where vLLM's CPU build runs (``requirements-vllm.txt``; ``--no-vllm`` skips it), decode also
times real vLLM in the same rounds: an in-process eager ``LLM`` (prefix caching off), the same
prompts as token ids, T=1 sampling, EOS ignored. vLLM pins its worker to one torch thread,
so compare at ``--threads 1`` (the default).

Decode table (``--decode-table``, ``decode_table()``): greedy decode of ``--batches`` x 32-token
prompts x 128 new tokens on ``--device`` (bf16, EOS ignored), generated tokens per second,
prefill included: minirl eager, minirl with CUDA graphs (CUDA only), transformers ``generate``
with its dynamic cache and with ``cache_implementation="static"``. The card goal: minirl with
graphs >= 1.5x transformers' static cache at batch 32 and 256.

Sampler (``--sampler``, ``sampler_table()``): one decode step's sampling of [B, V] logits at T=1 (what a
step costs beside the forward), minirl's ``sample`` (inverse CDF of one counter-based uniform per
row) against what one would pick instead: ``torch.multinomial`` on the softmax (one generator, so
a row's draw depends on its batch) and vLLM's CPU sampler's exponential race
(``probs / Exp(1)``, argmax), milliseconds per step, best of ``--repeats`` interleaved rounds.

Mismatch (``--mismatch``): for every zoo model, |logprob_minirl - logprob_transformers| on the
same sampled sequences, for the ``typical_inference`` and ``aligned`` presets (and ``aligned``
with a bf16 lm_head and router, transformers' own bf16 recipe) in bf16, in prefill (``score``)
and decode (``generate``'s logprobs), against transformers in bf16 (the bf16 trainer) and fp32.

    .venv/bin/python benchmarks/bench_engine.py                 # tiny-qwen3-moe, fp32
    .venv/bin/python benchmarks/bench_engine.py --dtype bfloat16
    .venv/bin/python benchmarks/bench_engine.py --mismatch --batch 16 --new-tokens 64
    .venv/bin/python benchmarks/bench_engine.py --decode-table --device cuda --dtype bfloat16
    .venv/bin/python benchmarks/bench_engine.py --decode-table --batches 1,4 --new-tokens 16   # CPU
    .venv/bin/python benchmarks/bench_engine.py --sampler --repeats 20
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from labs import zoo  # noqa: E402
from minirl import Engine, Knobs, SamplingParams  # noqa: E402
from minirl.engine.sampling import sample  # noqa: E402

MISMATCH_MODELS = ("tiny-llama", "tiny-qwen3", "tiny-qwen3-moe", "tiny-mixtral")


def _zoo_path(name: str) -> Path:
    """The zoo checkpoint, built if missing. The callers time under ``inference_mode`` /
    ``no_grad``, but a build trains its model (a backward pass), so it runs with autograd on:
    under them a fresh ``.zoo`` crashed with "element 0 of tensors does not require grad"."""
    root = Path(os.environ.get("MLAB_ZOO_DIR", REPO / ".zoo"))  # the test suite's zoo cache
    with torch.inference_mode(False), torch.enable_grad():
        return zoo.build(name, out=root / f"{name}-seed0")


def _hf(path: Path, dtype: torch.dtype) -> torch.nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()


def _best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time of each function over ``repeats`` rounds (after one warm-up round).

    Rounds interleave the functions, so load from other processes on a shared machine hits
    both sides alike; the best round is the least disturbed one.
    """
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in tqdm(range(repeats), desc="rounds", leave=False):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


@torch.inference_mode()  # both sides' fastest no-autograd mode (HF's generate gains ~15 % over no_grad)
def throughput(args: argparse.Namespace) -> dict[str, float]:
    dtype = getattr(torch, args.dtype)
    path = _zoo_path(args.model)
    engine = Engine.from_pretrained(path, dtype=dtype, knobs=Knobs.typical_inference())
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()  # its defaults
    gen = torch.Generator().manual_seed(0)
    vocab = engine.spec.vocab_size
    prompts = torch.randint(3, vocab, (args.batch, args.prompt_len), generator=gen)  # [B, P]
    long = torch.randint(3, vocab, (args.batch, args.prefill_len), generator=gen)  # [B, S]
    params = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True, seed=0)
    hf_config = copy.deepcopy(hf.generation_config)
    # eos_token_id=None is HF's ignore_eos (cheaper per step than a min_new_tokens logits processor)
    hf_config.update(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=args.new_tokens,
                     use_cache=True, eos_token_id=None, pad_token_id=hf.config.pad_token_id)

    def hf_generate() -> None:
        out = hf.generate(prompts, generation_config=hf_config, attention_mask=torch.ones_like(prompts))
        assert out.shape[1] == args.prompt_len + args.new_tokens

    decoders = {"minirl": lambda: engine.generate(prompts.tolist(), params), "hf": hf_generate}
    llm = _vllm(path, args)
    if llm is not None:
        decoders["vllm"] = lambda: _vllm_generate(llm, prompts, args.new_tokens)
    t = _best_times(decoders, args.repeats)
    p = _best_times({"minirl": lambda: engine.score(long.tolist()),
                     "hf": lambda: hf(long).logits.float().log_softmax(-1)}, args.repeats)
    n_gen, n_pre = args.batch * args.new_tokens, args.batch * args.prefill_len
    res = {"decode_minirl": n_gen / t["minirl"], "decode_hf": n_gen / t["hf"],
           "prefill_minirl": n_pre / p["minirl"], "prefill_hf": n_pre / p["hf"]}
    print(f"{args.model} {args.dtype}, {args.threads} CPU thread(s), torch {torch.__version__}, "
          f"transformers {transformers.__version__}, best of {args.repeats}")
    print(f"decode  (batch {args.batch}, prompt {args.prompt_len}, {args.new_tokens} new tokens): "
          f"minirl {res['decode_minirl']:8.0f} tok/s | transformers {res['decode_hf']:8.0f} tok/s | "
          f"ratio {res['decode_minirl'] / res['decode_hf']:.2f}x")
    if llm is not None:
        import vllm

        res["decode_vllm"] = n_gen / t["vllm"]
        print(f"decode, vLLM CPU {vllm.__version__}: {res['decode_vllm']:8.0f} tok/s | "
              f"minirl/vLLM {res['decode_minirl'] / res['decode_vllm']:.2f}x | "
              f"transformers/vLLM {res['decode_hf'] / res['decode_vllm']:.2f}x")
    print(f"prefill (batch {args.batch} x {args.prefill_len} tokens):             "
          f"minirl {res['prefill_minirl']:8.0f} tok/s | transformers {res['prefill_hf']:8.0f} tok/s | "
          f"ratio {res['prefill_minirl'] / res['prefill_hf']:.2f}x")
    return res


@torch.inference_mode()
def decode_table(model: str = "tiny-qwen3-moe", *, device: str = "cuda", batches: tuple[int, ...] = (1, 32, 256),
                 prompt_len: int = 32, new_tokens: int = 128, dtype: str = "bfloat16",
                 repeats: int = 3) -> dict[str, float]:
    """Greedy decode throughput, generated tokens per second (prefill included), per batch size:
    ``{"batch 32 minirl graphs": ..., "batch 32 minirl eager": ..., "batch 32 hf dynamic": ...,
    "batch 32 hf static": ..., "batch 32 graphs / hf static": ...}``. ``minirl graphs`` is
    timed on CUDA only (on CPU the engine decodes eagerly whatever it is asked). Each side runs
    one warm-up (graph capture, HF's static cache allocation), then the best of ``repeats``."""
    import transformers

    path, torch_dtype = _zoo_path(model), getattr(torch, dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
    configs = {}
    for cache in ("dynamic", "static"):  # eos None: HF's ignore_eos
        configs[cache] = copy.deepcopy(hf.generation_config)
        configs[cache].update(do_sample=False, max_new_tokens=new_tokens, use_cache=True, eos_token_id=None,
                              pad_token_id=hf.config.pad_token_id,
                              cache_implementation="static" if cache == "static" else None)
    graph_modes = (True, False) if torch.device(device).type == "cuda" else (False,)
    engines = {f"minirl {'graphs' if g else 'eager'}": Engine.from_pretrained(
        path, dtype=torch_dtype, knobs=Knobs.typical_inference(), device=device, cuda_graphs=g) for g in graph_modes}
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    out: dict[str, float] = {}
    for batch in batches:
        prompts = torch.randint(3, hf.config.vocab_size, (batch, prompt_len),
                                generator=torch.Generator().manual_seed(batch))  # [B, P]
        ids = prompts.to(device)
        sides = {f"hf {cache}": _synced(lambda config=config: hf.generate(
            ids, generation_config=config, attention_mask=torch.ones_like(ids)), device)
            for cache, config in configs.items()}
        sides |= {side: _synced(lambda eng=eng: eng.generate(prompts.tolist(), params), device)
                  for side, eng in engines.items()}
        best = _best_times(sides, repeats)
        for side, seconds in best.items():
            out[f"batch {batch} {side}"] = batch * new_tokens / seconds
        if "minirl graphs" in engines:
            out[f"batch {batch} graphs / hf static"] = best["hf static"] / best["minirl graphs"]
        out[f"batch {batch} eager / hf static"] = best["hf static"] / best["minirl eager"]
    return out


def _synced(fn: Callable[[], object], device: str) -> Callable[[], None]:
    """``fn`` timed to the end of its device work (CUDA runs asynchronously)."""

    def run() -> None:
        fn()
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    return run


def print_decode_table(res: dict[str, float]) -> None:
    """One line per batch size: tokens/s of each side, then the ratios to transformers static."""
    for batch in sorted({int(k.split()[1]) for k in res}):
        cells = {k.split(" ", 2)[2]: v for k, v in res.items() if int(k.split()[1]) == batch}
        print(f"batch {batch:4d}: " + " | ".join(f"{side} {v:.2f}x" if "/" in side else f"{side} {v:9.0f} tok/s"
                                                for side, v in cells.items()))


def _vllm(path: Path, args: argparse.Namespace):
    """An in-process vLLM on ``path``, or None (with the reason) when it cannot run here."""
    from minirl.vllm.llm import create_llm, unavailable_reason

    reason = "skipped (--no-vllm)" if args.no_vllm else unavailable_reason()
    if reason:
        print(f"vLLM: {reason}")
        return None
    llm = create_llm(path, args.dtype, max_num_seqs=max(args.batch, 1))
    torch.set_num_threads(args.threads)  # vLLM's worker set its own; keep the other engines at --threads
    return llm


def _vllm_generate(llm, prompts: torch.Tensor, new_tokens: int) -> None:
    from vllm import SamplingParams as VllmParams

    params = VllmParams(max_tokens=new_tokens, ignore_eos=True, temperature=1.0, seed=0)  # no top-k/top-p
    out = llm.generate([{"prompt_token_ids": row} for row in prompts.tolist()], params, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == new_tokens for o in out)


@torch.no_grad()
def mismatch(args: argparse.Namespace) -> dict[tuple[str, str, str, str], float]:
    """Mean |dlogprob| per (model, preset, phase, reference); also printed as a table."""
    presets = {"typical": Knobs.typical_inference(), "aligned": Knobs.aligned(),
               # transformers' own bf16 recipe: aligned, but lm_head and router left in bf16
               "hf-bf16": Knobs.aligned().replace(lm_head_dtype="act", router_dtype="act")}
    prompts = torch.randint(3, 500, (args.batch, args.prompt_len), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=args.new_tokens, seed=0, ignore_eos=True)
    out: dict[tuple[str, str, str, str], float] = {}
    print(f"mean (max) |logprob_minirl_bf16 - logprob_transformers| over {args.batch} x {args.new_tokens} "
          f"generated tokens")
    print(f"{'model':16s} {'preset':8s} {'phase':8s} {'vs hf bf16':>22s} {'vs hf fp32':>22s}")
    for name in tqdm(MISMATCH_MODELS, desc="models", leave=False):
        path = _zoo_path(name)
        refs = {"bf16": _hf(path, torch.bfloat16), "fp32": _hf(path, torch.float32)}
        for label, knobs in presets.items():
            engine = Engine.from_pretrained(path, dtype="bfloat16", knobs=knobs)
            rollouts = engine.generate(prompts.tolist(), params)
            seqs = [r.prompt_ids + r.token_ids for r in rollouts]
            mine = {"decode": torch.cat([r.logprobs for r in rollouts]),
                    "prefill": torch.cat([lp[args.prompt_len - 1:] for lp in engine.score(seqs)])}
            for phase, lp in mine.items():
                cells = []
                for ref_name, ref in refs.items():
                    logits = ref(torch.tensor(seqs)).logits.float()[:, args.prompt_len - 1:-1]  # [B, T, V]
                    ref_lp = logits.log_softmax(-1).gather(-1, torch.tensor(seqs)[:, args.prompt_len:, None])
                    d = (lp - ref_lp.flatten()).abs()
                    out[name, label, phase, ref_name] = d.mean().item()
                    cells.append(f"{d.mean().item():.2e} ({d.max().item():.2e})")
                print(f"{name:16s} {label:8s} {phase:8s} {cells[0]:>22s} {cells[1]:>22s}")
    return out


SAMPLER_SHAPES = ((32, 49_152), (256, 49_152), (32, 151_936))
"""[B, V]: smollm2's vocabulary at the RL batch and a large one, Qwen's vocabulary."""


@torch.inference_mode()
def sampler_table(shapes: tuple[tuple[int, int], ...] = SAMPLER_SHAPES, repeats: int = 20) -> dict[str, float]:
    """ms per sampling step of fp32 logits [B, V] at T=1: ``{"32x49152 minirl": ..., "32x49152
    multinomial": ..., "32x49152 exponential race": ...}``; every sampler draws from softmax(z)."""
    out = {}
    for b, v in shapes:
        z = torch.randn(b, v, generator=torch.Generator().manual_seed(0)) * 3  # [B, V]
        rows, params = torch.arange(b), SamplingParams()
        times = _best_times({
            "minirl": lambda: sample(z, params, 0, rows, 0),
            "multinomial": lambda: torch.multinomial(z.softmax(-1), 1),
            "exponential race": lambda: z.softmax(-1).div_(torch.empty_like(z).exponential_()).argmax(-1),
        }, repeats)
        out.update({f"{b}x{v} {name}": t * 1e3 for name, t in times.items()})
    return out


def print_sampler_table(res: dict[str, float]) -> None:
    shapes = dict.fromkeys(k.split(" ", 1)[0] for k in res)
    print(f"{'B x V':>10} {'minirl':>8} {'multinomial':>12} {'exp. race':>10}  minirl / fastest other")
    for shape in shapes:
        m, mult, race = (res[f"{shape} {n}"] for n in ("minirl", "multinomial", "exponential race"))
        print(f"{shape:>10} {m:8.2f} {mult:12.2f} {race:10.2f}  {m / min(mult, race):.2f}x   (ms per step)")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen3-moe")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prefill-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("BENCH_THREADS", "1")),
                    help="intra-op threads (1 is the steadiest on a shared CPU box)")
    ap.add_argument("--mismatch", action="store_true", help="measure typical vs aligned bf16 mismatch instead")
    ap.add_argument("--no-vllm", action="store_true", help="leave real vLLM out of the decode timing")
    ap.add_argument("--decode-table", action="store_true",
                    help="greedy decode tok/s: minirl eager/graphs vs transformers dynamic/static cache")
    ap.add_argument("--sampler", action="store_true", help="ms per sampling step: minirl vs multinomial vs exp. race")
    ap.add_argument("--device", default="cpu", help="--decode-table only: cpu or cuda")
    ap.add_argument("--batches", default="1,32,256", help="--decode-table only: comma-separated batch sizes")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.decode_table:
        res = decode_table(args.model, device=args.device, batches=tuple(int(b) for b in args.batches.split(",")),
                           prompt_len=args.prompt_len, new_tokens=args.new_tokens, dtype=args.dtype,
                           repeats=args.repeats)
        print(f"{args.model} {args.dtype} greedy decode on {args.device}, prompt {args.prompt_len}, "
              f"{args.new_tokens} new tokens, best of {args.repeats}")
        print_decode_table(res)
        return res
    if args.sampler:
        res = sampler_table(repeats=args.repeats)
        print(f"sampling at T=1, {args.threads} CPU thread(s), torch {torch.__version__}, best of {args.repeats}")
        print_sampler_table(res)
        return res
    return mismatch(args) if args.mismatch else throughput(args)


if __name__ == "__main__":
    main()
