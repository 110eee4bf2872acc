"""The backend seam as code (backend/ops.py): every backend implements every op, and nothing
outside the backend asks a backend for anything the contract does not declare."""
import ast
import inspect
import os

import pytest

import poseidon_caffe
from poseidon_caffe.backend.cpu import CPUBackend
from poseidon_caffe.backend.cuda import CUDABackend
from poseidon_caffe.backend.ops import Backend, DeviceOnly

PACKAGE = os.path.dirname(poseidon_caffe.__file__)
BACKENDS = [CPUBackend, CUDABackend]
# names that hold a backend by the house's habit, and the attributes that lead to one
BACKEND_NAMES = {"be", "backend", "device_backend", "gpu"}
BACKEND_ATTRIBUTES = {"backend", "_backend"}
BACKEND_CALLS = {"get_backend", "gpu_backend"}


def _public(cls):
    return {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize("cls", BACKENDS, ids=lambda c: c.__name__)
def test_every_backend_implements_every_op(cls):
    assert not cls.__abstractmethods__, "%s lacks %s" % (cls.__name__,
                                                        sorted(cls.__abstractmethods__))
    for name in Backend.ops():
        assert hasattr(cls, name), name
    # and offers nothing beyond the contract: an op a layer needs is declared first
    extra = _public(cls) - set(Backend.ops()) - {"ops", "device_ops"}
    assert not extra, "%s has ops outside backend/ops.py: %s" % (cls.__name__, sorted(extra))


def test_a_backend_that_lacks_an_op_cannot_be_made():
    class Partial(CPUBackend):
        relu_forward = Backend.relu_forward          # the bare declaration, not implemented
    with pytest.raises(TypeError, match="relu_forward"):
        Partial()


def test_the_device_backend_implements_the_device_ops_and_the_cpu_refuses_them():
    assert Backend.device_ops() == sorted(["batch_ring", "divide", "softmax_loss_forward_on_device",
                                           "solver_update", "sum_into", "synced_memory",
                                           "view"])
    for name in Backend.device_ops():
        assert getattr(CUDABackend, name) is not getattr(Backend, name), name
        assert getattr(CPUBackend, name) is getattr(Backend, name), name
    with pytest.raises(DeviceOnly, match="^synced_memory is a device op: the cpu backend"):
        CPUBackend().synced_memory(4)


def test_every_op_has_its_contract_written():
    for name in Backend.ops():
        value = inspect.getattr_static(Backend, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), "%s has no contract" % name


def test_the_cpu_backend_does_the_device_side_as_the_host():
    """Pinned buffers, streams, events and copies: what the sync engine drives on a device
    works on the CPU as plain host memory, a copy done when it returns."""
    import numpy as np
    be = CPUBackend()
    src = be.to_device(np.arange(6, dtype=np.float32).reshape(2, 3))
    dst = be.pinned_empty((6,), np.float32)
    stream = be.stream()
    be.copy_to_host(dst, src, stream)
    event = be.event()
    event.record(stream)
    assert event.query()
    np.testing.assert_array_equal(dst, np.arange(6))
    assert be.transfers_now().since(be.transfers_now()).htod_calls == 0


def _backend_uses(path):
    """(line, attribute) of every attribute read off a backend in one module, and every
    getattr(backend, ...), which the contract makes needless."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    imported = {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}

    def is_backend(node, names):
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Attribute):
            return node.attr in BACKEND_ATTRIBUTES
        if isinstance(node, ast.Call):
            f = node.func
            return (isinstance(f, ast.Name) and f.id in BACKEND_CALLS or
                    isinstance(f, ast.Attribute) and f.attr in BACKEND_CALLS)
        return False

    uses = []
    scopes = [n for n in ast.walk(tree)
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    for scope in scopes + [tree]:
        names = set(BACKEND_NAMES) - imported
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and is_backend(node.value, names):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(scope):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                    and is_backend(node.value, names)):
                uses.append((node.lineno, node.attr))
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and is_backend(node.args[0], names)):
                uses.append((node.lineno, "%s(...)" % node.func.id))
    return set(uses)


def _modules_outside_the_backend():
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        if os.path.relpath(root, PACKAGE).split(os.sep)[0] == "backend":
            continue
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(root, name)


def test_nothing_outside_the_backend_calls_beyond_the_contract():
    allowed = set(Backend.ops())
    bad, seen = [], 0
    for path in _modules_outside_the_backend():
        for line, attr in sorted(_backend_uses(path)):
            seen += 1
            if attr not in allowed:
                bad.append("%s:%d: .%s" % (os.path.relpath(path, PACKAGE), line, attr))
    assert seen > 100          # the scan finds the layers' calls at all
    assert not bad, "calls outside backend/ops.py:\n" + "\n".join(bad)


def test_the_scan_sees_a_call_outside_the_contract(tmp_path):
    path = tmp_path / "layer.py"
    path.write_text("def forward(self, bottom, top):\n"
                    "    be = self.backend\n"
                    "    be.relu_forward(bottom[0].dev_data, top[0].mutable_dev_data, 0.0)\n"
                    "    be.driver.synchronize()\n"
                    "    if getattr(be, 'on_device', False):\n"
                    "        pass\n")
    assert _backend_uses(str(path)) == {(3, "relu_forward"), (4, "driver"),
                                       (5, "getattr(...)")}


def _imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += ["." * node.level + (node.module or "") + ":" + a.name for a in node.names]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_the_interfaces_import_none_of_their_implementations():
    backend_dir = os.path.join(PACKAGE, "backend")
    # the seam names no backend; the driver interface and the choice name no driver
    assert _imports(os.path.join(backend_dir, "ops.py")) == ["abc", "dataclasses", "numpy"]
    for name in ("driver.py", "choice.py"):
        bad = [i for i in _imports(os.path.join(backend_dir, "cuda", name)) if "drivers" in i
               or any(d in i for d in ("cuda_bindings", "pycuda", "emulated"))]
        assert not bad, (name, bad)
    # the mode imports a backend only inside the function that asks for it
    tree = ast.parse(open(os.path.join(backend_dir, "__init__.py"), encoding="utf-8").read())
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
