"""Stages on whole models: zoo preparation, minirl decode and alignment, RL steps, Tracker overhead.

Timed calls end with a device synchronise, so a CUDA number is the work done, not the launch.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import statistics
import tempfile
import time
from collections import Counter
from typing import Callable

import torch

from benchmarks.bench_engine import _best_times, _hf, _zoo_path
from benchmarks.bench_tracker import build_model, timed
from benchmarks.gpu_check.plan import Plan
from benchmarks.gpu_check.runner import Recorder


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
    """Build the zoo checkpoints the later stages load (CPU work; cached across runs)."""
    if plan.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device here; on a CPU machine run the dry run: make gpu-check DRY=1")
    rec.put("device_name", torch.cuda.get_device_name() if plan.device == "cuda" else "cpu (dry run)")
    for name in _buildable(plan.zoo_models, rec):
        def build(name: str = name) -> None:
            t0 = time.perf_counter()
            _zoo_path(name)
            rec.put(f"{name} build_s", time.perf_counter() - t0)

        rec.attempt(name, build)


def engine(plan: Plan, rec: Recorder) -> None:
    for name in _buildable(plan.engine_models, rec):
        rec.attempt(f"{name} decode", lambda name=name: _decode(name, plan, rec))
        rec.attempt(f"{name} aligned fp32", lambda name=name: _aligned_fp32(name, plan, rec))


def _prompts(plan: Plan, vocab: int) -> torch.Tensor:
    d = plan.decode
    return torch.randint(3, vocab, (d["batch"], d["prompt_len"]), generator=torch.Generator().manual_seed(0))


@torch.inference_mode()
def _decode(name: str, plan: Plan, rec: Recorder) -> None:
    """Tokens per second of sampled bf16 decode (EOS ignored, KV cache on both sides): transformers
    ``generate`` first, so its number stands even when the engine cannot run on the device."""
    import transformers

    from minirl import Engine, Knobs, SamplingParams

    path, dev, new = _zoo_path(name), plan.device, plan.decode["new_tokens"]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    prompts = _prompts(plan, hf.config.vocab_size)
    config = copy.deepcopy(hf.generation_config)
    config.update(do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=new, use_cache=True,
                  eos_token_id=None, pad_token_id=hf.config.pad_token_id)  # eos None: HF's ignore_eos
    ids = prompts.to(dev)
    n_tokens = prompts.shape[0] * new
    hf_s = _best_times({"hf": _synced(lambda: hf.generate(ids, generation_config=config,
                                                          attention_mask=torch.ones_like(ids)), dev)},
                       plan.decode["repeats"])["hf"]
    rec.put(f"{name} transformers tok/s", n_tokens / hf_s)
    eng = Engine.from_pretrained(path, dtype=torch.bfloat16, knobs=Knobs.typical_inference(), device=dev)
    params = SamplingParams(max_new_tokens=new, ignore_eos=True, seed=0)
    mine_s = _best_times({"minirl": _synced(lambda: eng.generate(prompts.tolist(), params), dev)},
                         plan.decode["repeats"])["minirl"]
    rec.put(f"{name} minirl tok/s", n_tokens / mine_s)
    rec.put(f"{name} minirl / transformers", hf_s / mine_s)


@torch.no_grad()
def _aligned_fp32(name: str, plan: Plan, rec: Recorder) -> None:
    """Mean |logprob_minirl - logprob_transformers| on the engine's own fp32 samples."""
    from minirl import Engine, Knobs, SamplingParams

    path, dev, p_len = _zoo_path(name), plan.device, plan.decode["prompt_len"]
    eng = Engine.from_pretrained(path, dtype=torch.float32, knobs=Knobs.aligned(), device=dev)
    prompts = _prompts(plan, eng.spec.vocab_size)
    rollouts = eng.generate(prompts.tolist(), SamplingParams(max_new_tokens=plan.decode["new_tokens"], seed=0,
                                                             ignore_eos=True))
    seqs = torch.tensor([r.prompt_ids + r.token_ids for r in rollouts], device=dev)  # [B, P + new]
    mine = torch.stack([r.logprobs for r in rollouts]).to(dev)  # [B, new]
    logits = _hf(path, torch.float32).to(dev)(seqs).logits.float()[:, p_len - 1:-1]  # [B, new, V]
    ref = logits.log_softmax(-1).gather(-1, seqs[:, p_len:, None])[..., 0]
    diff = (mine - ref).abs()
    rec.put(f"{name} aligned fp32 mean|dlogp|", float(diff.mean()))
    rec.put(f"{name} aligned fp32 max|dlogp|", float(diff.max()))


def trainer(plan: Plan, rec: Recorder) -> None:
    """``minirl.train`` with ``device: auto``, every logprob variant call counted: on CUDA the
    trainer must call the Triton kernel (``kernels.fast``), never fall back to the torch twin."""
    import kernels
    import minirl
    from minirl.training.trainer import resolve_device

    device = resolve_device(plan.trainer["device"])
    want = "triton" if device.type == "cuda" else kernels.TORCH_TWIN["logprobs"]
    calls: Counter[str] = Counter()
    originals = {v: kernels.get("logprobs", v) for v in kernels.variants("logprobs")}
    for variant, fn in originals.items():
        kernels.register("logprobs", variant)(_counted(fn, variant, calls))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = {**plan.trainer, "model": str(_zoo_path(plan.trainer["model"])), "out_dir": tmp}
            t0 = time.perf_counter()
            result = minirl.train(config)
            rec.put("train_s", time.perf_counter() - t0)
    finally:
        for variant, fn in originals.items():
            kernels.register("logprobs", variant)(fn)
    step_s = [sum(v for k, v in row.items() if k.startswith("time_")) for row in result.rows]
    rec.put("device", str(next(result.model.parameters()).device))
    rec.put("steps", len(result.rows))
    rec.put("median_step_s", statistics.median(step_s))
    rec.put("losses", ", ".join(f"{row['loss']:.4g}" for row in result.rows))
    rec.put("logprob_calls", ", ".join(f"{v}={n}" for v, n in sorted(calls.items())))
    if not all(math.isfinite(row["loss"]) and not row["nan_skipped"] for row in result.rows):
        raise AssertionError(f"a loss was not finite: {[row['loss'] for row in result.rows]}")
    if next(result.model.parameters()).device.type != device.type:
        raise AssertionError(f"device auto resolved to {device} but the model is elsewhere")
    if calls[want] == 0 or set(calls) != {want}:
        raise AssertionError(f"the trainer's logprobs should all go through {want!r}; calls: {dict(calls)}")


def _counted(fn: Callable, variant: str, calls: Counter) -> Callable:
    def counting(*args, **kwargs):
        calls[variant] += 1
        return fn(*args, **kwargs)

    counting.__doc__ = fn.__doc__  # the registry insists on a docstring
    return counting


def tracker(plan: Plan, rec: Recorder) -> None:
    """Median forward time with a full capture (stats, tensor) over the plain forward's."""
    import aligntools

    t, dev = plan.tracker, plan.device
    model = build_model(t["hidden"], t["layers"], t["vocab"]).to(dev)
    ids = torch.randint(3, t["vocab"], (t["batch"], t["seq"]), generator=torch.Generator().manual_seed(0)).to(dev)

    def plain() -> None:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    captures = {mode: (lambda mode=mode: aligntools.capture(model, ids, mode=mode, progress=False))
                for mode in ("stats", "tensor")}
    cap = captures["tensor"]()
    rec.put("sites", len(cap.sites))
    runs = timed({"plain": _synced(plain, dev), **{m: _synced(f, dev) for m, f in captures.items()}}, plan.repeats)
    medians = {name: statistics.median(ts) for name, ts in runs.items()}
    rec.put("plain_ms", 1e3 * medians["plain"])
    for mode in captures:
        rec.put(f"{mode}_ms", 1e3 * medians[mode])
        rec.put(f"{mode}_overhead_x", medians[mode] / medians["plain"])
