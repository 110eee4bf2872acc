"""The kernels as named objects, their parameter lists read from the sources, and launching.

Every kernel is declared ``KERNEL name(const int n, ...)`` with parameters of three kinds:
pointers (``float*``, ``const int*``...), ``int`` and ``float``. The declarations are the one
place the parameter lists are written; ``signatures`` reads them, so pycuda's prepared calls
and the host build's ctypes types cannot drift from the source.

Each source ``kernels/<module>.cu`` has a module ``kernels/<module>.py`` listing its kernels as
``Kernel`` objects (``stub_text`` writes it; scripts/kernel_stubs.py rewrites them all, and a
test fails when one differs from its source), so a call reads
``launcher.run(kernels.neuron.relu_forward, n, x.ptr, y.ptr, slope)`` and a reader or a tool
follows it to the kernel's declaration.
"""
import os
import re
import textwrap

from . import build
from .driver import FLOAT, INT, POINTER, DriverError

BLOCK = 256                      # threads per block
BLOCKS_PER_MULTIPROCESSOR = 32   # enough blocks in flight; the grid-stride loop does the rest

_DECLARATION = re.compile(r"\bKERNEL\s+(\w+)\s*\(([^)]*)\)", re.S)
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


class SignatureError(ValueError):
    """A kernel declaration whose parameters the launcher cannot pass."""


class Kernel:
    """One kernel: its source ``module`` (kernels/<module>.cu), ``name`` and ``signature``."""
    __slots__ = ("module", "name", "signature")

    def __init__(self, module, name, signature):
        self.module, self.name, self.signature = module, name, signature

    def __repr__(self):
        return "<kernel %s.%s(%s)>" % (self.module, self.name, self.signature)


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


def declarations(text, where="kernel source"):
    """[(kernel name, signature, parameter names)] of the KERNEL declarations in a source
    text, in order; a signature is a string of P (pointer), i (int) and f (float)."""
    found = []
    for name, params in _DECLARATION.findall(_COMMENT.sub("", text)):
        parts = [p for p in params.split(",") if p.strip()]
        if not parts or parameter_kind(parts[0], name) != INT:
            raise SignatureError("%s: kernel %s must take its index count (int n) first"
                                 % (where, name))
        if any(name == seen for seen, _, _ in found):
            raise SignatureError("%s: kernel %s is declared twice" % (where, name))
        signature = "".join(parameter_kind(p, "%s(%s)" % (name, where)) for p in parts)
        found.append((name, signature, [p.replace("*", " ").split()[-1] for p in parts]))
    return found


def signatures(text, where="kernel source"):
    """{kernel name: signature} of the KERNEL declarations in a source text."""
    return {name: signature for name, signature, _ in declarations(text, where)}


def stub_text(module):
    """The text of kernels/<module>.py: the kernels of kernels/<module>.cu as Kernel objects."""
    with open(build.sources()[module], encoding="utf-8") as f:
        found = declarations(f.read(), module + ".cu")
    lines = ['"""The kernels of %s.cu, as named objects (written by scripts/kernel_stubs.py from '
             'the\nsource\'s KERNEL declarations; a test checks they agree)."""' % module,
             "from ..launch import Kernel", ""]
    for name, signature, params in found:
        lines += textwrap.wrap("(%s)" % ", ".join(params), 96, initial_indent="# ",
                               subsequent_indent="#  ")
        lines.append('%s = Kernel("%s", "%s", "%s")' % (name, module, name, signature))
    return "\n".join(lines) + "\n"


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
    """Every kernel of the sources, loaded on a driver: ``run(kernel, n, *args, stream=None)``
    launches a ``Kernel`` with a grid sized from n (on ``stream`` when one is given)."""

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

    def function(self, kernel):
        """The driver's function of ``kernel`` (its module loaded on first use)."""
        fn = self._functions.get(kernel)          # by the object: a stale one is checked
        if fn is None:
            module, path, signature = self._where.get(kernel.name, (None, None, None))
            if (module, signature) != (kernel.module, kernel.signature):
                raise DriverError("kernel %s.%s(%s) is not in the sources (kernels/%s.cu "
                                  "declares %s); run scripts/kernel_stubs.py"
                                  % (kernel.module, kernel.name, kernel.signature,
                                     kernel.module, signature or "no such kernel"))
            if module not in self._modules:
                self._modules[module] = self.driver.load_module(self.driver.module_image(path))
            fn = self._functions[kernel] = self._modules[module].function(kernel.name,
                                                                          signature)
        return fn

    def run(self, kernel, *args, stream=None):
        """Launch ``kernel`` over ``args[0]`` indices with ``args``."""
        self.driver.launch(self.function(kernel), grid_for(args[0], self.driver.info), BLOCK,
                           args, stream)
