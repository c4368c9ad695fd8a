"""``mlab audit --report OUT.html``: the audit as one self-contained HTML page (no scripts, no
network), to attach to a bug report or a CI artefact."""

from __future__ import annotations

import html
from pathlib import Path

from aligntools.audit.by_size import sentence
from aligntools.audit.result import AuditResult

STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
         "td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}.aligned{color:#070}.misaligned{color:#a00}")


def _table(header: list[str], rows: list[list[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def render(result: AuditResult) -> str:
    """The page: verdict, sizes, causes by share, the numeric remainder by bucket, routing per layer."""
    lines = result.summary().splitlines()
    parts = [f"<h1 class='{result.verdict}'>{html.escape(lines[0])}</h1>",
             _table(["gap (nats)", "floor", "limit", "tokens", "records"],
                    [[result.gap, result.floor, result.limit, result.tokens, result.records]])]
    if result.causes:
        parts += ["<h2>Causes, by share of the gap</h2>",
                  _table(["cause", "parameter", "estimate", "share", "fix"],
                         [[c.name, c.parameter, c.estimate, f"{c.share:.1%}", c.fix] for c in result.causes])]
    numeric = next((c for c in result.causes if c.name == "numeric"), None)
    if numeric is not None:
        buckets = {k: v for k, v in numeric.detail.items() if isinstance(v, dict) and "tokens" in v}
        parts += ["<h2>Numeric remainder, per token</h2>",
                  _table(["tokens by", "count", "mean |d logprob|"],
                         [[k, v["tokens"], v["mean_abs"]] for k, v in buckets.items()])]
        if numeric.detail.get("fingerprint"):
            parts += ["<h2>Fingerprint: the precision choice that reproduces the engine, token by token</h2>",
                      _table(["candidate", "share of the numeric gap it removes"],
                             [[name, f"{share:.0%}"] for name, share in numeric.detail["fingerprint"]])]
        sized = numeric.detail.get("by_size")
        if sized:
            parts += [f"<h2>Fingerprint by size: each candidate's own gap beside the recorded "
                      f"{sized['recorded']:.3g} nats</h2>",
                      f"<p>{html.escape(_first_up(sentence(sized)))}. Interval: 95 %, bootstrap over "
                      f"{sized['unit']}.</p>",
                      _table(["candidate", "its gap (nats)", "recorded / its gap", "95 % interval", "reading"],
                             [[c["candidate"], c["gap"], c["ratio"], f"[{c['low']:.2f}, {c['high']:.2f}]",
                               c["reading"]] for c in sized["candidates"]])]
        parts += _replayed(numeric.detail)
    if result.routing is not None:
        r = result.routing
        parts += [f"<h2>Routing: {r['tokens_with_flip']:.1%} of tokens flip in at least one layer</h2>",
                  _table(["layer", "flip rate"], [[i, x] for i, x in enumerate(r["flip_rate_per_layer"])]),
                  _table(["router margin, median", "flipped", "kept"],
                         [["k-th minus (k+1)-th logit", r["flip_margin_median"], r["kept_margin_median"]]])]
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>mlab audit</title><style>{STYLE}</style>"
            f"</head><body>{''.join(parts)}</body></html>\n")


def _first_up(text: str) -> str:
    """``text`` with its first letter upper-case, as a paragraph starts (the clause is mid-sentence in the
    summary)."""
    return text[:1].upper() + text[1:]


def _replayed(detail: dict) -> list[str]:
    """The replay through minirl (or why minirl could not run it) and, after ``--drill``, the op it names."""
    replayed, drilled = detail.get("replay"), detail.get("drill")
    if not replayed:
        return []
    engine = f"<code>{html.escape(str(replayed['engine']))}</code>"
    if "error" in replayed:
        return [f"<p>minirl could not replay this model as {engine}: {html.escape(str(replayed['error']))}</p>"]
    why = f" ({html.escape(str(replayed['why']))})" if replayed["why"] else ""
    out = [f"<p>Replayed through minirl {engine}: first divergent site "
           f"<b>{html.escape(str(replayed['first_divergence']))}</b>{why}.</p>"]
    if drilled:
        op = drilled["first_op"] or "no op jumps above its inputs' error"
        out.append(f"<p>Drilled into <b>{html.escape(drilled['site'])}</b>: {html.escape(op)}</p>")
    return out


def write_report(result: AuditResult, path: str | Path) -> Path:
    """Write ``render(result)`` to ``path``."""
    p = Path(path)
    p.write_text(render(result))
    return p
