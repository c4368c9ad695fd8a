"""Reference captures for "the Tracker's values did not change": write many, compare two sets.

    # the code under test, then an older checkout (git archive OLD aligntools kernels minirl labs
    # | tar -x -C /tmp/old): run by path, PYTHONPATH picks which aligntools is imported
    .venv/bin/python tests/aligntools/tracker/reference_captures.py write /tmp/after
    PYTHONPATH=/tmp/old .venv/bin/python tests/aligntools/tracker/reference_captures.py write /tmp/before
    .venv/bin/python tests/aligntools/tracker/reference_captures.py compare /tmp/before /tmp/after

Why a tool and not a test: a speed-up of the capture path must leave every stored byte as
it was, which is a comparison of two versions of the code, not of one version with itself.
The cases cover what the fast paths branch on: dtypes (fp32/bf16/fp16), both modes, long
inputs, a token filter, ``batch_size``, NaN/inf with payloads, generate with and without
left padding, streaming to zarr with tiny flushes, a budget downgrade, the benchmark
model and a wide vocabulary (rows longer than torch's parallel grain). Every variable and
coordinate is stored as raw bytes (attrs such as ``created`` are left out).
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings

import numpy as np
import torch

ZOO = ("tiny-llama", "tiny-qwen3", "tiny-qwen3-moe")


def write(out: str) -> int:
    """Write every case's capture to ``out/<case>.npz``; returns the number of cases."""
    import transformers

    import aligntools
    from labs import zoo

    os.makedirs(out, exist_ok=True)
    warnings.simplefilter("ignore")
    g = torch.Generator().manual_seed(1)
    ids, long_ids = torch.randint(3, 120, (2, 7), generator=g), torch.randint(3, 120, (3, 40), generator=g)
    gen_ids = torch.randint(3, 120, (2, 9), generator=torch.Generator().manual_seed(5))
    pad_mask = torch.ones(2, 9, dtype=torch.long)
    pad_mask[1, :3] = 0
    for name in ZOO:
        for dtype in (torch.float32, torch.bfloat16, torch.float16) if name == "tiny-llama" else (torch.float32,):
            model = transformers.AutoModelForCausalLM.from_pretrained(zoo.build(name), dtype=dtype).eval()
            tag = f"{name}-{str(dtype).removeprefix('torch.')}"
            for mode in ("tensor", "stats"):
                def cap(x, **kw):
                    return aligntools.capture(model, x, mode=mode, progress=False, **kw)
                _save(out, f"{tag}-{mode}", cap(ids))
                _save(out, f"{tag}-{mode}-long", cap(long_ids))
                _save(out, f"{tag}-{mode}-filter", cap(long_ids, token_filter=lambda m: m.position % 3 == 1))
                _save(out, f"{tag}-{mode}-batches", cap(long_ids, batch_size=2))
                handle = _poison(model)
                _save(out, f"{tag}-{mode}-nan", cap(long_ids))
                handle.remove()
                for case, mask in (("generate-pad", pad_mask), ("generate", None)):
                    with aligntools.Tracker(model, mode=mode, progress=False) as t:
                        model.generate(input_ids=gen_ids, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                       pad_token_id=0)
                    _save(out, f"{tag}-{mode}-{case}", t.capture)
                with tempfile.TemporaryDirectory() as d:
                    with aligntools.Tracker(model, mode=mode, progress=False, out=f"{d}/c.zarr", flush_bytes=4096):
                        model.generate(input_ids=gen_ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
                    _save(out, f"{tag}-{mode}-stream", aligntools.Capture.load(f"{d}/c.zarr").dataset.load())
            with aligntools.Tracker(model, budget_bytes=1_000_000, on_budget="stats", progress=False) as t:
                model(long_ids)
            _save(out, f"{tag}-downgrade", t.capture)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
    from bench_tracker import build_model

    bench = build_model(512, 4, 8192)
    bench_ids = torch.randint(3, 8192, (2, 256), generator=torch.Generator().manual_seed(0))
    cfg = transformers.LlamaConfig(vocab_size=70000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    wide = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    for mode in ("tensor", "stats"):
        _save(out, f"bench-{mode}", aligntools.capture(bench, bench_ids, mode=mode, progress=False))
        for n in (1, 3):
            wide_ids = torch.randint(3, 70000, (1, n), generator=torch.Generator().manual_seed(n))
            _save(out, f"wide{n}-{mode}", aligntools.capture(wide, wide_ids, mode=mode, progress=False))
    return len(os.listdir(out))


def compare(before: str, after: str) -> list[str]:
    """Differences between two ``write`` outputs (empty: byte-identical)."""
    diffs = []
    names = sorted(os.listdir(before))
    if names != sorted(os.listdir(after)):
        diffs.append(f"cases differ: {sorted(set(names) ^ set(os.listdir(after)))}")
    for name in names:
        a, b = np.load(os.path.join(before, name)), np.load(os.path.join(after, name))
        if sorted(a.files) != sorted(b.files):
            diffs.append(f"{name}: variables differ: {sorted(set(a.files) ^ set(b.files))}")
            continue
        diffs += [f"{name}: {key}" for key in a.files if not np.array_equal(a[key], b[key])]
    return diffs


def _save(out: str, name: str, capture: object) -> None:
    ds = getattr(capture, "dataset", capture)
    arrays = {}
    for key in ds.variables:
        a = np.ascontiguousarray(ds[key].values)
        arrays[f"bytes:{key}"] = np.array(a.tolist()) if a.dtype.kind == "U" else np.frombuffer(a.tobytes(), np.uint8)
        arrays[f"dtype:{key}"], arrays[f"shape:{key}"] = np.array(str(a.dtype)), np.array(a.shape)
    np.savez(os.path.join(out, f"{name}.npz"), **arrays)


def _poison(model: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Layer 1's MLP output replaced by a copy with NaN (one with a payload), +-inf and an
    all-NaN row, seen by the Tracker's hooks (registered later) as the engine's value."""
    def hook(module, args, out):
        out = out.clone()
        flat = out.view(-1)
        flat[::7], flat[3::11], flat[5::13] = float("nan"), float("inf"), -float("inf")
        if out.dtype == torch.float32:
            flat.view(torch.int32)[1::17] = 0x7FC00123
        out[0, 0] = float("nan")
        return out
    return model.model.layers[1].mlp.register_forward_hook(hook)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        print(f"{write(sys.argv[2])} captures written to {sys.argv[2]}")
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        found = compare(sys.argv[2], sys.argv[3])
        print("\n".join(found) or "byte-identical")
        sys.exit(1 if found else 0)
    else:
        sys.exit(__doc__)
