"""The arrows of docs/DESIGN.md, checked on the source: every import of every module of the
package (at module level and inside functions), resolved to the project module it names."""
import ast
import os
import re

import poseidon_caffe

PACKAGE = os.path.dirname(poseidon_caffe.__file__)
ROOT = os.path.dirname(PACKAGE)

# The thin faces that may start a command of tools/ (DESIGN.md: cli.py): module -> the
# places inside it that may import tools.
TOOLS_FACES = {
    "poseidon_caffe.cli": None,                                  # anywhere: it is the face
}

# Circles the walk still finds, each the set of modules it runs through; an entry goes when its
# circle does (the test says so). None is left: implementations are found by name (the sync
# strategies in sync/strategies/, the CUDA drivers by backend/cuda/choice.py), through
# importlib, which the walk rightly does not count as an arrow of the interface.
KNOWN_CIRCLES = []

with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as _f:
    # the compiled modules setup.py builds (there as .so files only once built)
    COMPILED = set(re.findall(r'Extension\(\s*"([\w.]+)"', _f.read()))


def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def package_sources():
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def is_main_block(node):
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name) and test.left.id == "__name__")


def project_imports(path):
    """[(line, imported module, enclosing place)] for every import of a poseidon_caffe module;
    the place is the outermost function or class name, "__main__" or None (module level)."""
    module = module_name(path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []

    def visit(node, place):
        for child in ast.iter_child_nodes(node):
            inner = place
            if place is None and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                    ast.ClassDef)):
                inner = child.name
            elif place is None and is_main_block(child):
                inner = "__main__"
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, place) for a in child.names
                             if a.name.split(".")[0] == "poseidon_caffe")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - child.level + 1])
                    base = base + "." + child.module if child.module else base
                else:
                    base = child.module or ""
                if base.split(".")[0] != "poseidon_caffe":
                    continue
                for a in child.names:
                    # "from . import x" may name a module; keep the submodule when it is one
                    sub = base + "." + a.name
                    is_module = (os.path.isdir(os.path.join(ROOT, *sub.split(".")))
                                 or os.path.isfile(os.path.join(ROOT, *sub.split(".")) + ".py")
                                 or sub in COMPILED)
                    found.append((child.lineno, sub if is_module else base, place))
            visit(child, inner)

    visit(tree, None)
    return module, found


ALL = {}
for _path in package_sources():
    _module, _imports = project_imports(_path)
    ALL[_module] = (os.path.relpath(_path, ROOT), _imports)


def under(module, room):
    name = "poseidon_caffe." + room
    return module == name or module.startswith(name + ".")


def rooms_other_than(room):
    """The package's top-level modules and packages, but room."""
    return sorted({m.split(".")[1] for m in ALL if "." in m} - {room})


def offenders(source_room, forbidden, allow=lambda module, place: False):
    out = []
    for module, (path, imports) in sorted(ALL.items()):
        if not under(module, source_room):
            continue
        for line, target, place in imports:
            if any(under(target, room) for room in forbidden) and not allow(module, place):
                out.append("%s:%d imports %s" % (path, line, target))
    return out


def test_the_walk_sees_the_package():
    assert len(ALL) > 100
    _, imports = ALL["poseidon_caffe.net.build"]
    assert any(under(t, "layers") for _, t, _ in imports)
    # function-level imports are seen too, with their place
    _, imports = ALL["poseidon_caffe.launch.command"]
    assert any(t == "poseidon_caffe.backend.cuda.choice" and place == "gpu_available"
               for _, t, place in imports)
    # a compiled module is a module, not its package
    _, imports = ALL["poseidon_caffe.backend.cpu.native"]
    assert [t for _, t, _ in imports] == ["poseidon_caffe.backend.cpu._kernels"]


def test_layers_never_import_sync_solver_tools_or_cli():
    bad = offenders("layers", ["sync", "solver", "tools", "cli"])
    assert not bad, "layers reach up the arrows:\n" + "\n".join(bad)


def test_net_and_solver_never_import_what_stands_above_them():
    bad = offenders("net", ["solver", "sync", "tools", "cli"])
    bad += offenders("solver", ["sync", "tools", "cli"])
    assert not bad, "the net or the solver reach up the arrows:\n" + "\n".join(bad)


def test_backend_imports_nothing_of_the_project():
    bad = offenders("backend", rooms_other_than("backend"))
    assert not bad, "the backend imports the project:\n" + "\n".join(bad)


def test_data_never_imports_layers():
    bad = offenders("data", ["layers"])
    assert not bad, "data imports layers:\n" + "\n".join(bad)


def test_nothing_in_the_library_imports_tools_but_the_faces():
    def allow(module, place):
        if module not in TOOLS_FACES:
            return False
        places = TOOLS_FACES[module]
        return places is None or place in places

    bad = []
    for room in rooms_other_than("tools"):
        bad += offenders(room, ["tools"], allow)
    assert not bad, "library modules import tools (only cli.py and the old command " \
                    "names may):\n" + "\n".join(bad)


def test_launch_imports_nothing_of_the_runtime_it_starts():
    """The launcher, joins, poseidon-run: what starts a job needs none of what runs in it
    (a rank reads the host file and the deadlines from launch, not the other way)."""
    bad = offenders("launch", sorted(set(rooms_other_than("launch")) - {"log", "backend"}))
    _, imports = ALL["poseidon_caffe.launch.command"]
    bad += ["launch/command.py imports %s" % t for _, t, _ in imports
            if under(t, "backend") and t != "poseidon_caffe.backend.cuda.choice"]
    assert not bad, "launch imports beyond log and the device choice:\n" + "\n".join(bad)


def import_graph():
    """{module: the package's modules it imports}; an imported name that is not a module of
    the package (a class, a function) counts as an import of the module that holds it."""
    graph = {}
    for module, (_, imports) in ALL.items():
        targets = set()
        for _, target, _ in imports:
            if target in COMPILED:
                continue                        # it imports nothing of the package
            while target not in ALL and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in ALL and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def import_circles(graph):
    """The circles of ``graph``: its strongly connected parts of more than one module (Tarjan's
    walk, without recursion), each a sorted list."""
    order, low, stack, on_stack, circles = {}, {}, [], set(), []
    for start in sorted(graph):
        if start in order:
            continue
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], order[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                part = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    circles.append(sorted(part))
    return circles


def test_the_circle_finder_finds_circles_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}}
    assert sorted(import_circles(graph)) == [["a", "b", "c"], ["d", "e"]]
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circles():
    """No module imports, at any depth, a module that imports it back (at module level or in
    a function, as the walk sees them); the known circles above aside, while they last."""
    circles = import_circles(import_graph())
    new = [c for c in circles if not any(set(c) <= known for known in KNOWN_CIRCLES)]
    assert not new, "import circles:\n" + "\n".join(" <-> ".join(c) for c in new)
    gone = [sorted(known) for known in KNOWN_CIRCLES
            if not any(len(set(c) & known) > 1 for c in circles)]
    assert not gone, "these circles are gone: remove them from KNOWN_CIRCLES: %s" % gone


def test_upgrade_imports_nothing_of_io():
    bad = offenders("upgrade", ["io"])
    assert not bad, "upgrade imports io:\n" + "\n".join(bad)


def test_io_reads_through_upgrade_writes_through_staging_and_nothing_else():
    allowed = {"io", "proto", "upgrade", "staging", "imageio"}
    bad = offenders("io", sorted(set(rooms_other_than("io")) - allowed))
    assert not bad, "io imports beyond proto, upgrade, staging, imageio:\n" + "\n".join(bad)


def test_staging_and_proto_import_nothing_of_the_project():
    bad = offenders("staging", rooms_other_than("staging"))
    bad += offenders("proto", rooms_other_than("proto"))
    assert not bad, "\n".join(bad)


def test_netlab_imports_nothing_of_the_project_and_the_library_nothing_of_netlab():
    """A lab reaches mpiexec through the environment it sets: sync needs nothing of it. The
    one reach in is the rate grammar (netlab.units), which the simulator shares so that a
    bandwidth reads the same in both commands."""
    bad = offenders("netlab", rooms_other_than("netlab"))
    for room in rooms_other_than("netlab"):
        if room == "simulator":
            bad += [line for line in offenders(room, ["netlab"])
                    if not line.endswith("imports poseidon_caffe.netlab.units")]
        elif room != "tools":
            bad += offenders(room, ["netlab"])
    assert "poseidon_caffe.netlab.lab" in ALL
    assert not bad, "\n".join(bad)


PRIVATE_REACH = re.compile(r"(solver|net|layer)\._\w|\.bottom_vecs\b|\.top_vecs\b|"
                           r"\.param_layer_indices\b|\.prefetcher\b")


def test_only_the_communicator_touches_mpi_in_the_sync_runtime():
    """MPI's calls, their byte counting included, go through sync/communicator.py."""
    users, seen = [], 0
    for folder, dirs, files in os.walk(os.path.join(PACKAGE, "sync")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            seen += 1
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n == "mpi4py" or n.startswith("mpi4py.") for n in names):
                    users.append(os.path.relpath(path, PACKAGE))
    assert seen > 10
    assert sorted(set(users)) == [os.path.join("sync", "communicator.py")], users


def test_sync_uses_no_private_attribute_of_net_solver_or_layer():
    bad, seen = [], 0
    sync = os.path.join(PACKAGE, "sync")
    for folder, dirs, files in os.walk(sync):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            seen += 1
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    code = line.split("#", 1)[0]
                    match = PRIVATE_REACH.search(code)
                    if match:
                        bad.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number,
                                                  line.strip()))
    assert seen > 10
    assert not bad, "sync reads private attributes:\n" + "\n".join(bad)


def test_the_private_attribute_check_would_catch_a_reach():
    assert PRIVATE_REACH.search("self.solver._snapshot_prefix()")
    assert PRIVATE_REACH.search("net.bottom_vecs[i]")
    assert PRIVATE_REACH.search("test_net._layer_names")
    assert not PRIVATE_REACH.search("solver.layer_resume_states()")


def marked_mpi(decorators):
    return any("mark.mpi" in ast.unparse(d) for d in decorators)


def runs_mpiexec(node):
    """subprocess.run/Popen/check_* of a list that starts with MPIEXEC."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "subprocess" and node.args
            and isinstance(node.args[0], ast.List) and node.args[0].elts):
        return False
    first = node.args[0].elts[0]
    return (isinstance(first, ast.Name) and first.id == "MPIEXEC"
            or isinstance(first, ast.Attribute) and first.attr == "MPIEXEC")


def test_tests_that_start_mpiexec_carry_the_mpi_marker():
    """A test that runs the mpiexec program itself starts a real job: `-m "not mpi"` must
    leave it out."""
    unmarked, seen = [], 0
    tests = os.path.join(ROOT, "tests")
    for name in sorted(os.listdir(tests)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        path = os.path.join(tests, name)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        whole_file = any(isinstance(n, ast.Assign) and "pytestmark" in ast.unparse(n)
                         and "mark.mpi" in ast.unparse(n) for n in tree.body)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            starts_mpiexec = any(runs_mpiexec(n) for n in ast.walk(node))
            seen += starts_mpiexec
            if starts_mpiexec and not whole_file and not marked_mpi(node.decorator_list):
                unmarked.append("tests/%s:%d %s" % (name, node.lineno, node.name))
    assert seen >= 3                  # the walk found the tests that run mpiexec
    assert not unmarked, "tests start mpiexec without the mpi marker:\n" + "\n".join(unmarked)
