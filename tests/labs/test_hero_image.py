"""The README's hero image is today's ``make demo`` figure (issue 66: it dated from 2026-11-23 and no
longer looked like the demo): the stamp beside it records the ``labs.demo.figure_version`` it was
drawn at and the image's sha256; both must match now. Not the date of the box: what the figure is
drawn from (the drawing code, the model's recipe, section 1's engines and tokens)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from labs import demo

REPO = Path(__file__).resolve().parents[2]
REGENERATE = "regenerate it: `python -m labs.demo --hero` (make demo's run, then the copy and its stamp)"


def test_the_readme_shows_the_hero_image():
    assert f"({demo.HERO.relative_to(REPO)})" in (REPO / "README.md").read_text()


def test_the_hero_image_is_the_one_its_stamp_describes():
    stamp = json.loads(demo.HERO.with_suffix(".json").read_text())
    assert hashlib.sha256(demo.HERO.read_bytes()).hexdigest() == stamp["png_sha256"], \
        f"{demo.HERO.name} was replaced without its stamp; {REGENERATE}"


def test_the_hero_image_is_drawn_by_todays_demo():
    stamp = json.loads(demo.HERO.with_suffix(".json").read_text())
    assert stamp["figure_version"] == demo.figure_version(), \
        f"{demo.HERO.name} was drawn at figure_version {stamp['figure_version']}, the demo now draws " \
        f"{demo.figure_version()} (aligntools/viz/plots.py, the model's zoo recipe or section 1 changed); {REGENERATE}"


def test_write_hero_copies_the_figure_and_stamps_it(tmp_path):
    png, hero = tmp_path / "error_growth.png", tmp_path / "hero.png"
    png.write_bytes(b"\x89PNG not really")
    assert demo.write_hero(png, hero) == hero and hero.read_bytes() == png.read_bytes()
    stamp = json.loads(hero.with_suffix(".json").read_text())
    assert stamp["figure_version"] == demo.figure_version()
    assert stamp["png_sha256"] == hashlib.sha256(png.read_bytes()).hexdigest() and stamp["made"]
