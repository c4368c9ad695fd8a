"""Engine specs: the one grammar every place that names an engine reads.

    KIND[:HEAD][,key=value...]

    hf[:DTYPE][,attn=eager|sdpa][,experts=eager|grouped_mm|batched_mm]
    minirl[:PRESET|DTYPE][,knob=value...][,dtype=DTYPE]
    vllm[:DTYPE][,max_model_len=N][,max_num_seqs=N][,prefix_caching=BOOL][,seed=N]

Why one grammar: ``mlab capture`` / ``mlab check``, ``aligntools.attribute`` and the trainer's
``TrainConfig.engine`` used to parse specs with three parsers that disagreed (``minirl:rmsnorm=hf``
was an override in one and an unknown preset in another). This module is syntax only: the first
item after ``:`` is the head unless it holds ``=`` (so ``minirl:tp=2`` sets a knob on the default
preset), the rest are ``key=value`` items, each key once. What a head or an option means, and
which values are valid, is the kind's row in ``minirl.engines.KINDS`` (``EngineSpec.parse``).
"""

from __future__ import annotations


def split(text: str) -> tuple[str, str | None, dict[str, str]]:
    """``"minirl:aligned, rmsnorm = hf"`` -> ``("minirl", "aligned", {"rmsnorm": "hf"})``: the
    kind, the head (None when absent) and the options as text. Raises ValueError naming the spec
    and the bad part."""
    if not isinstance(text, str):
        raise TypeError(f"an engine spec is a string such as 'minirl:typical'; got {type(text).__name__}")
    spec = text.strip()
    cut = min((i for i in (spec.find(":"), spec.find(",")) if i >= 0), default=len(spec))
    kind, rest = spec[:cut].strip(), spec[cut + 1:]
    items = [x.strip() for x in rest.split(",")] if rest.strip() else []
    if "" in items:  # "minirl:,," ran the defaults while "minirl:typical,=1" was refused
        raise ValueError(f"engine spec {text!r} has an empty item between commas; give "
                         f"{kind}[:HEAD][,key=value...] without empty items")
    head = items.pop(0) if items and "=" not in items[0] else None
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"engine spec {text!r}: expected key=value after the head; got {bad}")
    return kind, head, _key_values(text, items)


def join(kind: str, head: str | None, options: dict[str, object]) -> str:
    """The text of a spec: ``split(join(k, h, o))`` gives back ``k``, ``h`` and ``o`` as text."""
    return kind + (f":{head}" if head else "") + "".join(f",{k}={_text(v)}" for k, v in options.items())


def to_bool(text: str) -> bool:
    """``true/1/yes/on`` and ``false/0/no/off``, any case; anything else is a ValueError."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _key_values(text: str, items: list[str]) -> dict[str, str]:
    """``["tp=2", "rmsnorm = hf"]`` -> ``{"tp": "2", "rmsnorm": "hf"}``; a repeated key is refused
    (in a dict the last one would win without a word: ``tp=2,tp=4`` ran tp=4)."""
    pairs = [(key.strip(), value.strip()) for key, _, value in (item.partition("=") for item in items)]
    out: dict[str, str] = {}
    for key, value in pairs:
        if key in out:
            given = ",".join(f"{k}={v}" for k, v in pairs if k == key)
            raise ValueError(f"engine spec {text!r} sets option {key!r} more than once ({given}); give each "
                             f"option once")
        out[key] = value
    return out


def _text(value: object) -> str:
    """A typed option back to spec text (``True`` -> ``true``, ``None`` -> ``none``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return "none" if value is None else str(value)
