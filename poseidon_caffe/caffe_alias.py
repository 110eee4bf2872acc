"""``import caffe`` as a name for this package, opt-in and never over a real Caffe.

``poseidon-caffe alias install`` (tools/alias.py) writes a tiny ``caffe`` package into the active environment's
site-packages (or ``--target DIR``). Its ``__init__`` calls ``activate()``, which puts
``poseidon_caffe`` in ``sys.modules`` under the name ``caffe`` and adds a finder that answers
``caffe.X`` with ``poseidon_caffe.X``: ``import caffe.io``, ``from caffe.proto import
caffe_pb2`` and ``from caffe import layers as L`` give the very same module objects as the
``poseidon_caffe`` names (one protobuf registry, one set of layer classes).

The command refuses to install where a real Caffe is importable (a ``caffe`` package or module
on ``sys.path`` that is not this alias) and ``remove`` deletes only a package it wrote itself
(recognised by its marker line), so a Caffe installed beside this project is never shadowed or
touched.
"""
import importlib
import importlib.abc
import importlib.util
import os
import shutil
import sys
import sysconfig

ALIAS_NAME = "caffe"
TARGET_PACKAGE = "poseidon_caffe"
MARKER = "# poseidon-caffe pycaffe alias"

SHIM_SOURCE = MARKER + '''
# Written by `poseidon-caffe alias install`; `poseidon-caffe alias remove` deletes it.
# `import caffe` loads poseidon_caffe under the name pycaffe code uses.
from poseidon_caffe.caffe_alias import activate as _activate

_activate()
'''


class AliasError(RuntimeError):
    """The alias cannot be installed or removed here; the message says where and why."""


# -- the alias at import time ---------------------------------------------------------------

class _AliasLoader(importlib.abc.Loader):
    """Hands back the already-imported ``poseidon_caffe.X`` for ``caffe.X``."""

    def __init__(self, real_name):
        self.real_name = real_name

    def create_module(self, spec):
        module = importlib.import_module(self.real_name)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module):
        # the import system stamps the alias spec on the module; the module keeps its own
        module.__spec__ = self._real_spec


class AliasFinder(importlib.abc.MetaPathFinder):
    """``caffe.X`` -> ``poseidon_caffe.X`` (only while ``caffe`` is this package)."""

    prefix = ALIAS_NAME + "."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.prefix):
            return None
        alias = sys.modules.get(ALIAS_NAME)
        if alias is None or alias is not sys.modules.get(TARGET_PACKAGE):
            return None
        real_name = TARGET_PACKAGE + "." + fullname[len(self.prefix):]
        if real_name not in sys.modules and importlib.util.find_spec(real_name) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real_name))


def activate():
    """Make ``caffe`` (and every ``caffe.X``) name this package in the running interpreter."""
    package = importlib.import_module(TARGET_PACKAGE)
    if not any(isinstance(f, AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
    sys.modules[ALIAS_NAME] = package
    # submodules already loaded answer under both names at once
    for name, module in list(sys.modules.items()):
        if name.startswith(TARGET_PACKAGE + ".") and module is not None:
            sys.modules.setdefault(ALIAS_NAME + name[len(TARGET_PACKAGE):], module)
    return package


# -- installing and removing the shim package ------------------------------------------------

def default_target():
    """The active environment's site-packages (where ``pip install`` would put a package)."""
    return sysconfig.get_paths()["purelib"]


def _entry_is_alias(path):
    init = os.path.join(path, "__init__.py")
    try:
        with open(init, encoding="utf-8") as f:
            return f.readline().rstrip("\n") == MARKER
    except OSError:
        return False


def _caffe_entries(directory):
    """What in ``directory`` would answer ``import caffe``: a package, a module, an extension."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        full = os.path.join(directory, name)
        if name == ALIAS_NAME and os.path.isdir(full):
            found.append(full)
        elif name == ALIAS_NAME + ".py" or (name.startswith(ALIAS_NAME + ".")
                                             and name.endswith((".so", ".pyd"))):
            found.append(full)
    return found


def real_caffe_locations(search_path=None):
    """Every ``caffe`` on the search path that is not this alias (a real Caffe's pycaffe)."""
    search_path = sys.path if search_path is None else search_path
    seen, real = set(), []
    for directory in search_path:
        directory = os.path.abspath(directory or os.getcwd())
        if directory in seen:
            continue
        seen.add(directory)
        for entry in _caffe_entries(directory):
            if not (os.path.isdir(entry) and _entry_is_alias(entry)):
                real.append(entry)
    return real


def install(target=None, search_path=None):
    """Write the alias package into ``target``; returns its directory."""
    target = os.path.abspath(target or default_target())
    search = list(sys.path if search_path is None else search_path)
    if target not in [os.path.abspath(p or os.getcwd()) for p in search]:
        search.append(target)
    real = real_caffe_locations(search)
    if real:
        raise AliasError("a real Caffe is importable here (%s): the alias would shadow it, so "
                         "it was not installed; import this project as poseidon_caffe instead"
                         % ", ".join(real))
    if os.path.exists(target) and not os.path.isdir(target):
        raise AliasError("alias target %s is not a directory" % target)
    # a new --target folder is made, as `pip install --target` does
    os.makedirs(target, exist_ok=True)
    package = os.path.join(target, ALIAS_NAME)
    os.makedirs(package, exist_ok=True)
    temp = os.path.join(package, "__init__.py.tmp%d" % os.getpid())
    with open(temp, "w", encoding="utf-8") as f:
        f.write(SHIM_SOURCE)
    os.replace(temp, os.path.join(package, "__init__.py"))
    return package


def remove(target=None):
    """Delete the alias package from ``target``; returns its path, or None if none was there."""
    target = os.path.abspath(target or default_target())
    package = os.path.join(target, ALIAS_NAME)
    if not os.path.exists(package):
        return None
    if not (os.path.isdir(package) and _entry_is_alias(package)):
        raise AliasError("%s is not the poseidon-caffe alias (no marker line in its "
                         "__init__.py); it was left in place" % package)
    shutil.rmtree(package)
    return package


def status(target=None, search_path=None):
    """(alias package path or None, [real Caffe locations]) for ``target`` and the search path."""
    target = os.path.abspath(target or default_target())
    package = os.path.join(target, ALIAS_NAME)
    installed = package if os.path.isdir(package) and _entry_is_alias(package) else None
    search = list(sys.path if search_path is None else search_path)
    if target not in [os.path.abspath(p or os.getcwd()) for p in search]:
        search.append(target)
    return installed, real_caffe_locations(search)
