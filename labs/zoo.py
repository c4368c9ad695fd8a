"""Tiny model zoo: real Hugging Face checkpoints built locally from a config and a seed.

Why build instead of download: tests and CI have no network, and alignment experiments need
the *same* checkpoint format that transformers and inference engines load (config.json +
model.safetensors + tokenizer files). Each model is initialised from a seed and trained for
a few dozen steps on the built-in corpus, so its logits are far from uniform (random-init logits
hide precision effects), though flatter than a real model's (smollm2-135m is the real one).
Same name + seed gives byte-identical weights; builds are cached and written atomically.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock
from tqdm.auto import tqdm

from aligntools.gates.inputs import corpus_text
from labs.corpus import training_texts
from labs.tokenizer import build_tokenizer
from labs.zoo_specs import SPECS, ZooSpec
from minirl import OutputPathError, check_directory_takes_files
from minirl.quiet import quiet_when_asked

ZOO_FORMAT = 1  # bump when the build recipe changes, so caches rebuild


def names() -> list[str]:
    """Names of the zoo models."""
    return list(SPECS)


def default_root() -> Path:
    """Cache root: ``$MLAB_ZOO_DIR`` or ``~/.cache/mismatch-lab/zoo``."""
    return Path(os.environ.get("MLAB_ZOO_DIR", Path.home() / ".cache" / "mismatch-lab" / "zoo"))


@quiet_when_asked
def build(name: str, out: str | os.PathLike | None = None, seed: int = 0, force: bool = False,
          progress: bool = True) -> Path:
    """Build (or reuse) zoo model ``name`` and return its checkpoint directory.

    ``progress=False`` silences every bar the build draws (its own training bar and
    transformers' "Writing model shards"), so a quiet notebook cell stays quiet. The build runs
    with autograd on whatever the caller's grad mode (a build inside ``torch.no_grad()`` used to
    fail on its first backward).

    ``out`` defaults to ``default_root()/name-seed{seed}``. A finished build is reused when its
    recipe fingerprint matches; a rebuild writes to a temporary sibling and renames it in, so
    an interrupted build never leaves a half-written checkpoint behind.
    """
    spec = _spec(name)
    _check_seed(seed)
    target = Path(out) if out is not None else default_root() / f"{name}-seed{seed}"
    fingerprint = _fingerprint(name, spec, seed)
    if not force and _is_complete(target, fingerprint):
        return target
    _check_target(target)
    parent = target.parent
    hint = "Pass out= a writable directory or set MLAB_ZOO_DIR."
    try:
        check_directory_takes_files(target, "zoo model")  # else FileLock retries forever on a lock it cannot create
    except OutputPathError as e:
        raise OutputPathError(f"{e}. {hint}") from e
    try:
        lock = FileLock(parent / f".{target.name}.lock")
        lock.acquire()  # a second builder (another test worker, notebook or shell) waits for the first
    except OSError as e:
        raise OSError(f"cannot write zoo model to {target}: {e.strerror or e}. "
                      f"{hint}") from e
    try:
        if force or not _is_complete(target, fingerprint):  # the first builder may have finished it
            _build_locked(target, name, spec, seed, fingerprint, progress)
    finally:
        lock.release()
    return target


def _build_locked(target: Path, name: str, spec: ZooSpec, seed: int, fingerprint: str, progress: bool) -> None:
    """Build into a temporary sibling and rename it in: an interrupted build never leaves a
    half-written checkpoint behind."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with torch.inference_mode(False), torch.enable_grad():
            _build_into(tmp, name, spec, seed, fingerprint, progress)
        _replace_dir(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def weights_hash(path: str | os.PathLike) -> str:
    """sha256 of the checkpoint's model.safetensors (what "byte-identical" is checked on)."""
    return hashlib.sha256((Path(path) / "model.safetensors").read_bytes()).hexdigest()


def _spec(name: str) -> ZooSpec:
    if name not in SPECS:
        raise ValueError(f"unknown zoo model {name!r}; valid names: {', '.join(names())}")
    return SPECS[name]


def _check_seed(seed: object) -> None:
    """torch seeds are 64-bit; anything else would fail deep inside torch with 'Overflow'."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**64:
        raise ValueError(f"zoo seed must be an integer in [0, 2**64); got {seed!r}")


def _check_target(target: Path) -> None:
    """Refuse an ``out`` the zoo did not write: a build replaces its target, and a user's file
    or directory must never be the thing replaced. Ours have a zoo.json; empty dirs are fine."""
    if target.is_dir() and not (target / "zoo.json").is_file() and any(target.iterdir()):
        raise ValueError(f"zoo build --out {target}: directory exists, is not empty and is not a zoo "
                         f"checkpoint (no zoo.json); refusing to replace it. Give a new or empty directory")
    if target.exists() and not target.is_dir():
        raise ValueError(f"zoo build --out {target}: an existing file is in the way; refusing to replace "
                         f"it. Give a new or empty directory")


def _fingerprint(name: str, spec: ZooSpec, seed: int) -> str:
    """Everything a build depends on: recipe, seed, training text, and the transformers version
    (its initialisation defines the weights), so a stale cache is never reused."""
    import transformers

    corpus = hashlib.sha256(corpus_text().encode()).hexdigest()
    blob = json.dumps([ZOO_FORMAT, name, seed, spec.config_class, spec.config, spec.train_steps, spec.train,
                       corpus, transformers.__version__] + ([spec.gguf] if spec.gguf else []), sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _is_complete(path: Path, fingerprint: str) -> bool:
    """A finished build of this recipe whose weights are the bytes it wrote (size, then sha256)."""
    meta, weights = path / "zoo.json", path / "model.safetensors"
    if not meta.exists() or not weights.exists():
        return False
    try:
        info = json.loads(meta.read_text())
        stat = weights.stat()
    except (OSError, json.JSONDecodeError):
        return False
    return (info.get("fingerprint") == fingerprint and info.get("weights_bytes") == stat.st_size
            and _cached_hash(str(path), stat.st_size, stat.st_mtime_ns) == info.get("weights_sha256"))


@functools.lru_cache(maxsize=32)
def _cached_hash(path: str, size: int, mtime_ns: int) -> str:
    """``weights_hash`` once per file version per process (tests call ``build`` many times)."""
    return weights_hash(path)


def _replace_dir(tmp: Path, target: Path) -> None:
    """Swap ``tmp`` into ``target``; the old build is removed only after the swap.
    ``_check_target`` already refused targets the zoo did not write; checked again here
    because a file may have appeared during the build."""
    _check_target(target)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    tmp.rename(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _build_into(tmp: Path, name: str, spec: ZooSpec, seed: int, fingerprint: str, progress: bool = True) -> None:
    import transformers

    if spec.gguf is not None:
        from labs.zoo_gguf import convert

        n_params = convert(spec.gguf, tmp, label=f"converting {name}", sha256=spec.gguf_sha256)
        _write_meta(tmp, {"name": name, "seed": seed, "fingerprint": fingerprint, "description": spec.description,
                          "source": spec.gguf, "source_sha256": spec.gguf_sha256, "n_params": n_params})
        return

    texts = training_texts(seed=0)  # the tokenizer and data are shared by all zoo models
    tokenizer = build_tokenizer(texts)
    config_cls = getattr(transformers, spec.config_class)
    config = config_cls(**spec.config, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    loss = _train_briefly(model, tokenizer, texts, spec, seed, label=f"building {name}", progress=progress)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _write_meta(tmp, {"name": name, "seed": seed, "fingerprint": fingerprint, "description": spec.description,
                      "train_steps": spec.train_steps, "final_train_loss": loss,
                      "n_params": sum(p.numel() for p in model.parameters())})


def _write_meta(tmp: Path, meta: dict) -> None:
    """zoo.json, stamped with the weights' size and sha256 so a truncated or altered
    model.safetensors in the cache is rebuilt instead of returned."""
    weights = tmp / "model.safetensors"
    stamp = {"weights_bytes": weights.stat().st_size, "weights_sha256": weights_hash(tmp)}
    (tmp / "zoo.json").write_text(json.dumps({**meta, **stamp}, indent=2))


def _train_briefly(model: torch.nn.Module, tokenizer, texts: list[str], spec: ZooSpec, seed: int,
                   label: str = "training", progress: bool = True) -> float:
    """A few AdamW steps of next-token prediction on packed corpus text; returns last loss."""
    ids = torch.tensor(tokenizer("\n".join(texts))["input_ids"])  # [T]
    seq, batch = spec.train["seq"], spec.train["batch"]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.train["lr"], weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in tqdm(range(spec.train_steps), desc=label, unit="step", leave=False, disable=not progress):
        starts = torch.randint(0, len(ids) - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[s:s + seq] for s in starts.tolist()])  # [B, S]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.detach())
