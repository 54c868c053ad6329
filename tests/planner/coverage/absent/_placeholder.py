"""Importable stand-ins for packages the shared venv lacks (torchvision, torchaudio), for generate.py's recorder
only: vLLM's multimodal modules import them at module level. Nothing of them is ever called: the recorder builds
models on the meta device and reads their KV-cache specs. Any name resolves to an inert placeholder; a model whose
construction does call one fails and is recorded with that error.

    from _placeholder import install; install(__name__, globals())   # a stand-in's __init__.py
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


def install(package: str, namespace: dict) -> None:
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
            raise RuntimeError(f"{package} is absent from the coverage recorder")

        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _Placeholder()

    def module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, fullname, path, target=None):
            if fullname.startswith(package + "."):
                return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            return None

        def create_module(self, spec):
            module = types.ModuleType(spec.name)
            module.__path__ = []
            module.__getattr__ = module_getattr
            return module

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, _Finder())
    namespace["__version__"] = "0.0"
    namespace["__getattr__"] = module_getattr
