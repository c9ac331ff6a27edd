"""Stand-ins for packages that SGLang imports at start-up but a plain dense model never uses.

Loaded by Python at start-up from PYTHONPATH (the SGLang recipe puts this folder first), in every
process SGLang spawns. ``STANDIN_MODULES`` names the packages ("name=version,..."); a stand-in answers
every attribute, call and submodule with a permissive dummy, so an import passes and any real use
fails later (or does nothing). benchmarks/gpu/README.md lists each stand-in and what then does not
work. After installing the finder this module runs the next ``sitecustomize`` on the path, if any.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types


class _AnyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any

    def __getitem__(cls, item):
        return cls


class _Any(metaclass=_AnyMeta):
    """Instances and the class itself: callable, subscriptable, attribute-rich, subclassable."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Any()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any()

    def __getitem__(self, key):
        return _Any()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


def _stubs() -> dict:
    """name -> (version, submodules): "name=1.0" stands in for the package and every submodule;
    "name/a+b=1.0" for the package and the submodules ``name.a`` and ``name.b`` only (and what is
    below them), so that ``try: import name.other`` still fails where callers probe that way;
    "name/top=1.0" for the package alone."""
    out = {}
    for part in os.environ.get("STANDIN_MODULES", "").split(","):
        name, _, version = part.strip().partition("=")
        name, _, subs = name.partition("/")
        if name:
            out[name] = (version or "0.0.0", None if not subs else set(subs.split("+")) - {"top"})
    return out


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Any


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, stubs: dict):
        self.stubs = stubs

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split(".")
        if parts[0] not in self.stubs:
            return None
        allowed = self.stubs[parts[0]][1]
        if len(parts) == 1 or allowed is None or parts[1] in allowed:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = self.stubs[spec.name.split(".")[0]][0]
        module.__sgl_stub__ = True
        return module

    def exec_module(self, module):
        pass


_names = _stubs()
if _names:
    sys.meta_path.insert(0, _StubFinder(_names))

# chain to the image's own sitecustomize, if there is one further along the path
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != _here]
)
if _spec is not None and _spec.loader is not None:
    _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
