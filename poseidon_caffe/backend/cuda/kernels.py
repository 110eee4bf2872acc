"""The kernels' parameter lists, read from the sources, and launching them by name.

Every kernel is declared ``KERNEL name(const int n, ...)`` with parameters of three kinds:
pointers (``float*``, ``const int*``...), ``int`` and ``float``. The declarations are the one
place the parameter lists are written; ``signatures`` reads them, so pycuda's prepared calls
and the host build's ctypes types cannot drift from the source.
"""
import os
import re

from . import build
from .driver import FLOAT, INT, POINTER, DriverError

BLOCK = 256                      # threads per block
BLOCKS_PER_MULTIPROCESSOR = 32   # enough blocks in flight; the grid-stride loop does the rest

_DECLARATION = re.compile(r"\bKERNEL\s+(\w+)\s*\(([^)]*)\)", re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


class SignatureError(ValueError):
    """A kernel declaration whose parameters the launcher cannot pass."""


def parameter_kind(text, where):
    words = text.replace("*", " * ").split()
    if "*" in words:
        return POINTER
    base = [w for w in words[:-1] if w not in ("const", "__restrict__")]
    if base == ["int"]:
        return INT
    if base == ["float"]:
        return FLOAT
    raise SignatureError("%s: parameter %r is not a pointer, int or float" % (where, text.strip()))


def signatures(text, where="kernel source"):
    """{kernel name: signature} of the KERNEL declarations in a source text, each signature a
    string of P (pointer), i (int) and f (float), in parameter order."""
    found = {}
    for name, params in _DECLARATION.findall(_COMMENT.sub("", text)):
        parts = [p for p in params.split(",") if p.strip()]
        if not parts or parameter_kind(parts[0], name) != INT:
            raise SignatureError("%s: kernel %s must take its index count (int n) first"
                                 % (where, name))
        if name in found:
            raise SignatureError("%s: kernel %s is declared twice" % (where, name))
        found[name] = "".join(parameter_kind(p, "%s(%s)" % (name, where)) for p in parts)
    return found


def source_signatures():
    """{module: {kernel: signature}} over every kernel source."""
    result = {}
    for module, path in build.sources().items():
        with open(path, encoding="utf-8") as f:
            result[module] = signatures(f.read(), os.path.basename(path))
    return result


def grid_for(count, info):
    """Blocks for ``count`` indices: one per BLOCK, at most what keeps every multiprocessor
    busy (the grid-stride loop covers the rest)."""
    blocks = -(-max(int(count), 1) // BLOCK)
    return max(1, min(blocks, BLOCKS_PER_MULTIPROCESSOR * max(1, info.multiprocessors),
                      info.max_grid_dim[0]))


class KernelSet:
    """Every kernel of the sources, loaded on a driver: ``kernels.relu_forward(n, x, y, slope)``
    launches with a grid sized from n; ``kernels.launch(name, args, stream)`` names a stream."""

    def __init__(self, driver, modules=None):
        self.driver = driver
        self._where = {}
        self._functions = {}
        self._modules = {}
        paths = build.sources()
        table = source_signatures()
        for module in (modules or sorted(table)):
            if module not in table:
                raise DriverError("no kernel source named %s (have %s)"
                                  % (module, ", ".join(sorted(table))))
            for name, signature in table[module].items():
                if name in self._where:
                    raise DriverError("kernel %s is in both %s and %s"
                                      % (name, self._where[name][0], module))
                self._where[name] = (module, paths[module], signature)

    @property
    def names(self):
        return sorted(self._where)

    def function(self, name):
        fn = self._functions.get(name)
        if fn is None:
            if name not in self._where:
                raise DriverError("no kernel named %s" % name)
            module, path, signature = self._where[name]
            if module not in self._modules:
                self._modules[module] = self.driver.load_module(self.driver.module_image(path))
            fn = self._functions[name] = self._modules[module].function(name, signature)
        return fn

    def launch(self, name, args, stream=None):
        fn = self.function(name)
        self.driver.launch(fn, grid_for(args[0], self.driver.info), BLOCK, args, stream)

    def __getattr__(self, name):
        if name.startswith("_") or name not in self.__dict__.get("_where", {}):
            raise AttributeError(name)
        return lambda *args, stream=None: self.launch(name, args, stream)
