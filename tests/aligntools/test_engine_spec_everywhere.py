"""One spec, one engine: every documented engine spec read by every entry point that takes one
(``mlab capture``, the gate, ``attribute``, the trainer's ``TrainConfig.engine``) reaches the
engine constructors with the same settings, with a dtype given or not (``minirl.engines``).

The constructors (transformers' ``from_pretrained``, minirl's ``Engine.from_pretrained``,
``create_llm``) are replaced by a stub that raises ``Built`` with what it was given, so the
test needs no model loads and no vLLM, yet sees exactly what each entry point would build.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minirl.sglang import runner as sglang_engine
from minirl.vllm import llm as vllm_engine
from aligntools.gates import inputs as gate_inputs
from minirl import Engine, EngineSpec, Knobs, TrainConfig, build_engine
from minirl.engines import KINDS

REPO = Path(__file__).resolve().parents[2]
SPEC = re.compile(r"(?<![\w./-])((?:minirl|hf|vllm)(?::[a-z0-9_]+(?:=[a-z0-9_.+-]+)?)?(?:,[a-z_]+=[a-z0-9_.+-]+)*)"
                  r"(?![\w=])")  # a placeholder (`tp=N`) is not cut down to a spec (`minirl:tp`)


def documented_specs() -> list[str]:
    """Every concrete spec written in README.md, docs/, configs/ and notebooks/ (placeholders
    such as ``vllm:DTYPE`` are upper case and not matched), plus the three bare kinds."""
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "configs").glob("*.yaml"),
             *(REPO / "notebooks").glob("*.ipynb")]
    found = {m for f in files for m in SPEC.findall(f.read_text()) if ":" in m or "," in m}
    return sorted(found | {"hf", "minirl", "vllm"})


SPECS = documented_specs()


def test_the_documents_and_the_table_are_read():
    assert len(TABLE_SPECS) >= 20 and {"minirl:aligned", "minirl:float32", "vllm"} <= set(TABLE_SPECS)
    assert len(SPECS) >= 12 and {"minirl:typical,weights=int4", "vllm:bfloat16", "hf:bfloat16"} <= set(SPECS)


class Built(BaseException):
    """Raised by the stub constructors: ``settings`` is what the engine would have been built with.
    A BaseException so that no entry point's ``except Exception`` (the gate wraps a failed load
    as a usage error, ``mlab`` turns errors into exit 2) can swallow it."""

    def __init__(self, settings: tuple) -> None:
        super().__init__(settings)
        self.settings = settings


@pytest.fixture
def stubs(monkeypatch):
    """Stub every engine constructor; vLLM and SGLang count as available."""
    import transformers

    def hf(path, dtype, **kwargs):
        raise Built(("hf", str(dtype).removeprefix("torch."), kwargs.get("attn_implementation"),
                     kwargs.get("experts_implementation")))

    def minirl(cls, path, dtype="float32", knobs=None, device="cpu"):
        raise Built(("minirl", dtype, knobs.to_dict()))

    def vllm(path, dtype=None, **options):
        raise Built(("vllm", dtype, options))

    def sglang(path, dtype=None, **options):
        raise Built(("sglang", dtype, options))

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", hf)
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(minirl))
    monkeypatch.setattr(vllm_engine, "create_llm", vllm)
    monkeypatch.setattr(vllm_engine, "unavailable_reason", lambda: None)
    monkeypatch.setattr(sglang_engine, "create_runner", sglang)
    monkeypatch.setattr(sglang_engine, "unavailable_reason", lambda: None)


def built(fn) -> tuple:
    with pytest.raises(Built) as info:
        fn()
    return info.value.settings


def trainer_engine(spec: str, path: Path, dtype: str | None) -> object:
    """What ``mlab train`` builds: the config checks the spec, then ``Trainer`` builds it (the
    same call as ``Trainer.__init__``; the trainer itself would load the stubbed model first)."""
    config = TrainConfig(model=str(path), engine=spec, engine_dtype=dtype)
    return build_engine(config.engine, path, config.engine_dtype, rollouts=True)


def entry_points(spec: str, path: Path, tmp_path: Path, dtype: str | None) -> dict[str, tuple]:
    """What each entry point that takes ``spec`` would build, with ``dtype`` given (or not)."""
    import aligntools
    from labs.cli import main

    kind = EngineSpec.parse(spec).kind
    capture = ["capture", "--model", str(path), "--engine", spec, "--text", "hi", "--out", str(tmp_path / "c.nc")]
    out = {"mlab capture": built(lambda: main(capture + (["--dtype", dtype] if dtype else [])))}
    if kind == "hf":
        out["gate --train"] = built(lambda: aligntools.check_alignment(path, train=spec, tokens=8, progress=False))
        out["attribute train="] = built(lambda: aligntools.attribute(path, train=spec, tokens=8, progress=False))
    else:
        out["gate --infer"] = built(lambda: build_engine(gate_inputs.parse_infer(spec, dtype).spec, path))
        out["TrainConfig.engine"] = built(lambda: trainer_engine(spec, path, dtype))
    return out


TABLE_SPECS = [str(EngineSpec(kind, dtype, preset)) for kind, row in KINDS.items()
               for preset in (None, *row.presets) for dtype in (None, *row.dtypes)]
"""Every kind x preset x dtype of ``minirl.engines.KINDS`` (None: left to the default)."""


@pytest.mark.parametrize("spec", TABLE_SPECS)
def test_a_spec_means_one_engine_in_check_and_train(spec, stubs, zoo):
    """Before: ``minirl:aligned`` ran in float32 in ``mlab check`` but in bfloat16 in ``mlab train``
    (``engine_dtype`` defaulted to bfloat16), and ``minirl:float32`` was refused by ``train``. Every
    spec of the table: one engine, or (an ``hf`` spec, which cannot roll out) one refusal."""
    path = zoo("tiny-llama")
    parsed = EngineSpec.parse(spec)
    if parsed.kind == "hf":
        with pytest.raises(ValueError, match="cannot generate rollouts"):
            TrainConfig(model=str(path), engine=spec)
        with pytest.raises(ValueError, match="--infer must be minirl"):
            gate_inputs.parse_infer(spec, None)
        return
    check = built(lambda: build_engine(gate_inputs.parse_infer(spec, None).spec, path))
    assert built(lambda: trainer_engine(spec, path, None)) == check
    assert check[:2] == (parsed.kind, parsed.engine_dtype())


@pytest.mark.parametrize("spec", SPECS)
def test_one_spec_builds_one_engine_everywhere(spec, stubs, zoo, tmp_path):
    path = zoo("tiny-llama")
    parsed = EngineSpec.parse(spec)
    assert EngineSpec.parse(str(parsed)) == parsed
    unset = entry_points(spec, path, tmp_path, None)
    given = entry_points(spec, path, tmp_path, parsed.engine_dtype())
    settings = {**{f"{k} (no dtype)": v for k, v in unset.items()}, **given}
    assert len(set(map(repr, settings.values()))) == 1, settings
    kind, dtype, *rest = next(iter(settings.values()))
    assert (kind, dtype) == (parsed.kind, parsed.engine_dtype())
    if kind == "minirl":
        assert rest == [parsed.knobs().to_dict()]
    if kind == "vllm":
        assert rest == [parsed.options]


def test_minirl_knob_after_the_colon_means_the_same_everywhere(stubs, zoo):
    """Before: ``minirl:rmsnorm=hf`` was an override in ``mlab check`` but an unknown preset
    'rmsnorm=hf' in the trainer's ``engine:``."""
    want = Knobs.typical_inference().replace(rmsnorm="hf")
    assert EngineSpec.parse("minirl:rmsnorm=hf").knobs() == want
    assert gate_inputs.parse_infer("minirl:rmsnorm=hf", None).spec.knobs() == want
    assert built(lambda: trainer_engine("minirl:rmsnorm=hf", zoo("tiny-llama"), None))[2] == want.to_dict()


def test_vllm_has_one_default_dtype(stubs, zoo, tmp_path):
    """Before: ``mlab capture --engine vllm`` built float32, ``mlab check --infer vllm`` bfloat16."""
    path = zoo("tiny-llama")
    assert EngineSpec.parse("vllm").engine_dtype() == "bfloat16"
    assert {v[1] for v in entry_points("vllm", path, tmp_path, None).values()} == {"bfloat16"}


def test_hf_float64_loads_in_float64_with_the_eager_experts_loop(stubs, zoo, tmp_path):
    assert set(entry_points("hf:float64", zoo("tiny-llama"), tmp_path, None).values()) == {
        ("hf", "float64", None, "eager")}


@pytest.mark.parametrize("spec, dtype", [("vllm:float16", "bfloat16"), ("minirl:aligned,dtype=float32", "bfloat16"),
                                         ("hf:bfloat16", "float32")])
def test_a_spec_and_a_dtype_that_disagree_are_refused_everywhere(spec, dtype, stubs, zoo, tmp_path, capsys):
    """Before: the CLI took the spec's dtype silently, the trainer refused the pair."""
    from labs.cli import main

    path = zoo("tiny-llama")
    match = f"names dtype {EngineSpec.parse(spec).dtype} but the dtype given is {dtype}"
    assert main(["capture", "--model", str(path), "--engine", spec, "--dtype", dtype, "--text", "hi",
                 "--out", str(tmp_path / "c.nc")]) == 2
    assert match in capsys.readouterr().err
    if not spec.startswith("hf"):
        with pytest.raises(ValueError, match=match):
            gate_inputs.parse_infer(spec, dtype)
        with pytest.raises(ValueError, match=match):
            TrainConfig(model=str(path), engine=spec, engine_dtype=dtype)


def test_the_gate_and_the_cli_raise_one_usage_error_class():
    from aligntools.cli.inputs import UsageError
    from aligntools.gates import GateUsageError

    assert UsageError is GateUsageError
    with pytest.raises(UsageError, match="unknown engine 'tgi'"):
        gate_inputs.parse_infer("tgi", None)

