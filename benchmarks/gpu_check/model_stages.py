"""Stages on whole models: zoo preparation, minirl alignment and decode speed, Tracker overhead.

Timed calls end with a device synchronise, so a CUDA number is the work done, not the launch.
"""

from __future__ import annotations

import copy
import importlib.util
import time
from typing import Callable

import torch

from benchmarks.bench_engine import _best_times, _hf, _zoo_path
from benchmarks.bench_tracker import build_model, device_overhead
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.rl_stage import rl_checkpoint, zoo_root
from benchmarks.gpu_check.runner import Recorder

#: Knobs.aligned() fp32 against transformers fp32, mean |delta logprob|: what "aligned" promises.
ALIGNED_MEAN_MAX = 1e-5
TRACKER_GOALS = {"stats": 1.3, "tensor": 2.0}  # overhead over the plain forward on the card (issue 36)


def _synced(fn: Callable[[], object], device: str) -> Callable[[], None]:
    def run() -> None:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()

    return run


def missing_source(name: str) -> str | None:
    """Why zoo model ``name`` cannot be built here, or None. A converted model needs the package
    that ships its GGUF: smollm2-135m's (98 MB) is over what travels to a lent card (64 MiB)."""
    from labs import zoo

    gguf = zoo.SPECS[name].gguf
    package = gguf.split("/")[0] if gguf else None
    if package and importlib.util.find_spec(package) is None:
        return f"not built here: needs the {package} package (its GGUF), which this machine lacks"
    return None


def _buildable(names: tuple[str, ...], rec: Recorder) -> list[str]:
    """The models that can be built here; each other one is named in the report, with why."""
    for name in names:
        if (why := missing_source(name)) is not None:
            rec.put(name, why)
    return [name for name in names if missing_source(name) is None]


def prepare(plan: Plan, rec: Recorder) -> None:
    """Build the zoo checkpoints the later stages load and the RL arms' SFT-warmed model (CPU work;
    cached across runs, carried to the card by ``make gpu-wheels``)."""
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device here; on a CPU machine run the dry run: make gpu-check DRY=1")
    rec.put("device_name", torch.cuda.get_device_name() if plan.device == "cuda" else "cpu (dry run)")
    for name in _buildable(plan.zoo_models, rec):
        def build(name: str = name) -> None:
            t0 = time.perf_counter()
            _zoo_path(name)
            rec.put(f"{name} build_s", time.perf_counter() - t0)

        rec.attempt(name, build)

    def warm() -> None:
        t0 = time.perf_counter()
        rec.put("gpu_rl model", rl_checkpoint(zoo_root(), plan.gpu_rl).name)
        rec.put("gpu_rl model build_s", time.perf_counter() - t0)

    rec.attempt("gpu_rl model", warm)


def engine(plan: Plan, rec: Recorder) -> None:
    for name in _buildable(plan.engine_models, rec):
        rec.attempt(f"{name} aligned fp32", lambda name=name: _aligned_fp32(name, plan, rec))
    rec.attempt("decode", lambda: _decode_table(plan, rec))


def _prompts(plan: Plan, batch: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (batch, plan.decode["prompt_len"]), generator=torch.Generator().manual_seed(0))


@torch.inference_mode()
def _decode_table(plan: Plan, rec: Recorder) -> None:
    """Greedy bf16 decode (EOS ignored, every side its own KV cache) in generated tokens per
    second, prefill included: transformers ``generate`` with its dynamic and its static cache,
    minirl eager and with CUDA graphs, at each batch size. The goal: minirl's best at least
    ``goal`` x transformers static at every batch size from 32 up, said met or missed."""
    import transformers

    from minirl import Engine, Knobs, SamplingParams

    d, dev = plan.decode, plan.device
    path, new = _zoo_path(d["model"]), d["new_tokens"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    configs = {}
    for cache in ("dynamic", "static"):
        configs[cache] = copy.deepcopy(hf.generation_config)
        configs[cache].update(do_sample=False, max_new_tokens=new, use_cache=True, eos_token_id=None,
                              pad_token_id=hf.config.pad_token_id,  # eos None: HF's ignore_eos
                              cache_implementation="static" if cache == "static" else None)
    engines = {"minirl eager": Engine.from_pretrained(path, torch.bfloat16, Knobs.typical_inference(), device=dev,
                                                      cuda_graphs=False)}
    if dev == "cuda":
        engines["minirl cuda graphs"] = Engine.from_pretrained(path, torch.bfloat16, Knobs.typical_inference(),
                                                               device=dev)
        rec.put("minirl cuda graphs path", engines["minirl cuda graphs"].decode_path)
    else:
        rec.put("minirl cuda graphs", "skipped: CUDA graphs need a CUDA device")
    params = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    for batch in d["batches"]:
        prompts = _prompts(plan, batch, hf.config.vocab_size)
        ids = prompts.to(dev)
        sides = {f"transformers {cache}": _synced(lambda config=config: hf.generate(
            ids, generation_config=config, attention_mask=torch.ones_like(ids)), dev)
            for cache, config in configs.items()}
        sides.update({side: _synced(lambda eng=eng: eng.generate(prompts.tolist(), params), dev)
                      for side, eng in engines.items()})
        best = _best_times(sides, d["repeats"])
        for side, seconds in best.items():
            rec.put(f"batch {batch} {side} tok/s", batch * new / seconds)
        ratio = best["transformers static"] / min(best[side] for side in engines)
        rec.put(f"batch {batch} minirl / transformers static", ratio)
        if batch >= 32:
            rec.put(f"batch {batch} goal {d['goal']}x", "met" if ratio >= d["goal"] else "missed")


@torch.no_grad()
def _aligned_fp32(name: str, plan: Plan, rec: Recorder) -> None:
    """Mean |logprob_minirl - logprob_transformers| on the engine's own fp32 samples, TF32 off on
    both sides (a TF32 matmul alone moves logprobs by ~1e-3); it must be at most 1e-5."""
    from minirl import Engine, Knobs, SamplingParams

    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    path, dev, p_len = _zoo_path(name), plan.device, plan.decode["prompt_len"]
    eng = Engine.from_pretrained(path, dtype=torch.float32, knobs=Knobs.aligned(), device=dev)
    prompts = _prompts(plan, plan.decode["batches"][-1], eng.spec.vocab_size)
    rollouts = eng.generate(prompts.tolist(), SamplingParams(max_new_tokens=plan.decode["new_tokens"], seed=0,
                                                             ignore_eos=True))
    seqs = torch.tensor([r.prompt_ids + r.token_ids for r in rollouts], device=dev)  # [B, P + new]
    mine = torch.stack([r.logprobs for r in rollouts]).to(dev)  # [B, new]
    logits = _hf(path, torch.float32).to(dev)(seqs).logits.float()[:, p_len - 1:-1]  # [B, new, V]
    ref = logits.log_softmax(-1).gather(-1, seqs[:, p_len:, None])[..., 0]
    diff = (mine - ref).abs()
    rec.put(f"{name} aligned fp32 mean|dlogp|", float(diff.mean()))
    rec.put(f"{name} aligned fp32 max|dlogp|", float(diff.max()))
    if float(diff.mean()) > ALIGNED_MEAN_MAX:
        raise AssertionError(f"{name}: Knobs.aligned() fp32 is {float(diff.mean()):.2e} from transformers fp32 on "
                             f"average; at most {ALIGNED_MEAN_MAX:.0e} expected")


def tracker(plan: Plan, rec: Recorder) -> None:
    """Capture overhead over the plain forward (paired medians), beside the three floors
    ``bench_tracker.device_overhead`` measures in the same run, the host syncs and
    device-to-host copies of one capture (CUDA only), and issue 36's goals: stats <= 1.3x,
    tensor <= 2x."""
    t, dev = plan.tracker, plan.device
    model = build_model(t["hidden"], t["layers"], t["vocab"]).to(dev)
    ids = torch.randint(3, t["vocab"], (t["batch"], t["seq"]), generator=torch.Generator().manual_seed(0))
    result = device_overhead(model, ids, repeats=plan.repeats)
    for key, value in result.items():
        rec.put(key, "n/a (CUDA only)" if value is None else value)
    for mode, goal in TRACKER_GOALS.items():
        rec.put(f"goal {mode} <= {goal}x", "met" if result[f"{mode}_x"] <= goal else "missed")
