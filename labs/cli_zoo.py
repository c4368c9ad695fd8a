"""``mlab zoo list`` / ``mlab zoo build NAME [--out DIR] [--seed N]``.

``list`` reads only the recipe table, so it answers without importing torch; ``build`` imports
the builder when it runs."""

from __future__ import annotations

import argparse
import json

from labs.zoo_specs import SPECS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("zoo", help="build or list tiny built-in models (no downloads)")
    zsub = p.add_subparsers(dest="zoo_command", required=True)
    lst = zsub.add_parser("list", help="list zoo models")
    lst.set_defaults(func=_list)
    b = zsub.add_parser("build", help="build a zoo checkpoint (cached)")
    b.add_argument("name", help="zoo model name (see `mlab zoo list`)")
    b.add_argument("--out", default=None, help="checkpoint directory (default: $MLAB_ZOO_DIR/NAME-seedN)")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--force", action="store_true", help="rebuild even if a matching build exists")
    b.set_defaults(func=_build)


def _list(args: argparse.Namespace) -> int:
    for name, spec in SPECS.items():
        print(f"{name:18s} {spec.config_class:20s} {spec.description}")
    return 0


def _build(args: argparse.Namespace) -> int:
    from minirl.output_paths import check_parents

    if args.out is not None:
        check_parents(args.out, "zoo model")  # at once, not after the builder's imports (~10 s)
    from labs import zoo

    path = zoo.build(args.name, out=args.out, seed=args.seed, force=args.force)
    meta = json.loads((path / "zoo.json").read_text())
    # Trained models report their last loss; converted ones (GGUF) were never trained here.
    origin = (f"train loss {meta['final_train_loss']:.3f}" if "final_train_loss" in meta
              else f"converted from {meta['source']}")
    # The recipe's description: zoo.json keeps the text of its build, and rewording it does not rebuild.
    print(f"{path}\n  {SPECS[args.name].description}; {meta['n_params']:,} params; {origin}; "
          f"sha256 {zoo.weights_hash(path)[:16]}")
    return 0
