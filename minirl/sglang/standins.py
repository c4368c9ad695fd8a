"""Stand-ins for the two packages SGLang imports on its CPU text-model path that have no CPU
wheel on the package index: ``sgl_kernel`` and ``torchvision`` (docs/sglang.md).

Why stand-ins and not the real wheels: every ``sgl-kernel`` / ``sglang-kernel`` wheel is one CUDA
build (no CPU wheel, no sdist), and the index's torchvision is built for another torch and breaks
``import transformers`` (``operator torchvision::nms does not exist``). SGLang imports eight
names from ``sgl_kernel`` at module load (KV-cache copies and speculative decoding helpers) and
calls none of them on the path the lab uses: with nothing registered under
``torch.ops.sgl_kernel`` its ``cpu_has_amx_support()`` is False and its layers take
``forward_native`` (plain torch). Each stand-in raises, naming itself, if it is ever called, so a
path that would need a real kernel fails loudly instead of computing something else.

Order matters: transformers decides once, at its first import, whether torchvision is
installed. The torchvision stand-in goes into ``sys.modules`` only after that, so transformers
keeps treating torchvision as absent (with the stand-in visible it would import vision code that
needs the real package). ``install`` does this in order; nothing is installed when this module
is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

# The sgl_kernel names SGLang 0.5.23 imports at module load on the CPU text path.
SGL_KERNEL_NAMES = (
    "copy_all_layer_kv_cache_cpu",  # mem_cache: KV copy between layers (hierarchical cache)
    "assign_req_to_token_pool_cpu",  # mem_cache: batched slot assignment (the plain path is torch)
    "build_tree_kernel_efficient_cpu",  # speculative decoding (EAGLE tree)
    "verify_tree_greedy_cpu",  # speculative decoding
    "assign_draft_cache_locs_contiguous_cpu",  # speculative decoding
    "assign_extend_cache_locs_cpu",  # speculative decoding
    "fill_accept_out_cache_loc_cpu",  # speculative decoding
    "fill_bonus_tokens_cpu",  # speculative decoding
)
ENV = {"SGLANG_USE_CPU_ENGINE": "1"}  # SGLang's CPU engine path (no CUDA probing at import)


class StandInCalled(RuntimeError):
    """SGLang called a kernel the lab stands in for: this path needs the real ``sgl_kernel``."""


def _raiser(name: str):
    def stand_in(*args: object, **kwargs: object) -> None:
        raise StandInCalled(f"sgl_kernel.{name} was called, but minirl.sglang.standins only stands in for it "
                            f"(no CPU sgl_kernel wheel exists): this SGLang path needs the real kernel; run it "
                            f"on a GPU machine with the upstream wheels (docs/gpu.md)")
    stand_in.__name__ = stand_in.__qualname__ = name
    return stand_in


def _module(name: str, doc: str) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    module.__file__ = __file__
    return module


def sgl_kernel_module() -> types.ModuleType:
    """``sgl_kernel`` with the eight CPU names, each raising ``StandInCalled`` if called."""
    module = _module("sgl_kernel", "minirl.sglang.standins: no CPU sgl_kernel exists; every name raises if called")
    module.__version__ = "0.0.0+standin"
    for name in SGL_KERNEL_NAMES:
        setattr(module, name, _raiser(name))
    return module


class Absent:
    """What a torchvision name is under the stand-in: module-level code may name it (an
    ``InterpolationMode.BICUBIC`` default), calling it raises naming it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Absent(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise StandInCalled(f"{self._name} was called, but minirl.sglang.standins only stands in for torchvision so "
                            f"SGLang's text path imports (the real one breaks transformers); vision models need it")

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class TorchvisionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``torchvision`` and every ``torchvision.*`` submodule SGLang imports as an empty
    package whose names are ``Absent``."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, "minirl.sglang.standins: torchvision stand-in (docs/sglang.md)")
        module.__path__ = []
        module.__version__ = "0.0.0+standin"
        module.__getattr__ = lambda attr: _absent_attr(spec.name, attr)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _absent_attr(module: str, attr: str) -> Absent:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return Absent(f"{module}.{attr}")


def install() -> None:
    """Put both stand-ins in place (after transformers has recorded torchvision as missing) and
    set SGLang's CPU environment. A real package that is installed (a GPU machine's upstream
    wheels) is never shadowed."""
    import transformers.utils.import_utils  # noqa: F401  (records torchvision as absent first)

    import torch

    if not torch.cuda.is_available():
        for key, value in ENV.items():
            os.environ.setdefault(key, value)
    if "sgl_kernel" not in sys.modules and importlib.util.find_spec("sgl_kernel") is None:
        sys.modules["sgl_kernel"] = sgl_kernel_module()
    if importlib.util.find_spec("torchvision") is None and not any(isinstance(f, TorchvisionFinder)
                                                                 for f in sys.meta_path):
        sys.meta_path.append(TorchvisionFinder())
