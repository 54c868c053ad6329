"""An importable torchvision for generate.py's recorder only (the shared venv has none, and vLLM's multimodal
modules import its image transforms at module level). No transform is ever called: the recorder builds models on
the meta device and reads their KV-cache specs. Any name resolves to an inert placeholder; a model whose
construction does call one fails and is recorded with that error."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0"


class _PlaceholderType(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return cls

    def __iter__(cls):
        return iter(())


class _Placeholder(metaclass=_PlaceholderType):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        raise RuntimeError("torchvision is absent from the coverage recorder")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Placeholder


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = __getattr__
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
