"""The sgl_kernel stand-in (minirl/sglang/standins.py), without importing SGLang; torchvision's is
tested where SGLang is imported (test_sglang.py)."""

from __future__ import annotations

import pytest

from minirl.sglang import standins


@pytest.mark.parametrize("name", standins.SGL_KERNEL_NAMES)
def test_each_sgl_kernel_stand_in_raises_with_its_own_name(name):
    stand_in = getattr(standins.sgl_kernel_module(), name)
    with pytest.raises(standins.StandInCalled, match=rf"sgl_kernel\.{name} was called"):
        stand_in(1, 2)


def test_the_stand_ins_are_the_eight_names_sglang_imports():
    assert len(set(standins.SGL_KERNEL_NAMES)) == 8
