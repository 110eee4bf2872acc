"""The commands live in poseidon_caffe/tools/: the library parses no argument list, upgrade
needs nothing of io, io reads legacy files as written for the upgrade commands, and the old
command names still start the commands."""
import ast
import os
import re
import subprocess
import sys

import pytest

import poseidon_caffe
from poseidon_caffe import io
from poseidon_caffe.proto import caffe_pb2

PACKAGE = os.path.dirname(poseidon_caffe.__file__)
ROOT = os.path.dirname(PACKAGE)
COMMAND_SIGNS = re.compile(r"^\s*(import argparse|from argparse\b)|\bsys\.argv\b|"
                           r"^\s*def \w*main\(", re.MULTILINE)


def library_sources():
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d not in ("tools", "__pycache__")]
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(folder, name)


def test_library_modules_parse_no_argument_lists():
    found = []
    for path in library_sources():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found += ["%s: %s" % (os.path.relpath(path, ROOT), m.group(0).strip())
                  for m in COMMAND_SIGNS.finditer(text)]
    assert len(list(library_sources())) > 50          # the walk saw the library
    assert found == []


def imported_modules(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            names.update(base + ("" if node.module else a.name) for a in node.names)
    return names


def test_upgrade_imports_nothing_of_io():
    names = imported_modules(os.path.join(PACKAGE, "upgrade.py"))
    assert ".proto" in names                            # the parse saw its imports
    assert not [n for n in names if n in (".io", "poseidon_caffe.io") or n.startswith(".io.")]


V1_NET = """name: "old"
layers { name: "conv" type: CONVOLUTION bottom: "data" top: "conv" blobs_lr: 2
  convolution_param { num_output: 4 kernel_size: 3 } }
"""


def test_io_reads_legacy_files_as_written_or_upgraded(tmp_path):
    text = tmp_path / "v1.prototxt"
    text.write_text(V1_NET)
    raw = io.read_net_param(str(text), upgrade=False)
    assert len(raw.layers) == 1 and len(raw.layer) == 0
    assert raw.layers[0].type == caffe_pb2.V1LayerParameter.CONVOLUTION
    assert list(raw.layers[0].blobs_lr) == [2.0]
    new = io.read_net_param(str(text))
    assert len(new.layers) == 0 and new.layer[0].type == "Convolution"
    assert new.layer[0].param[0].lr_mult == 2.0

    binary = tmp_path / "v1.caffemodel"
    binary.write_bytes(raw.SerializeToString())
    assert io.read_net_binary(str(binary), upgrade=False) == raw
    assert io.read_net_binary(str(binary)).layer[0].type == "Convolution"

    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "n.prototxt" base_lr: 0.01 solver_type: NESTEROV\n')
    old = io.read_solver_param(str(solver), upgrade=False)
    assert old.solver_type == caffe_pb2.SolverParameter.NESTEROV and not old.HasField("type")
    assert io.read_solver_param(str(solver)).type == "Nesterov"


def test_reading_as_written_keeps_the_readers_checks(tmp_path):
    solver = tmp_path / "solver.prototxt"
    solver.write_text('net: "n.prototxt" base_lr: 0.01\n')
    with pytest.raises(io.ProtoFileError, match=r"solver\.prototxt:1:1: this looks like a "
                                                r"solver, not a net: field 'net'"):
        io.read_net_param(str(solver), upgrade=False)
    with pytest.raises(io.ProtoFileError, match="is a text file, expected a binary"):
        io.read_net_binary(str(solver), upgrade=False)


def test_the_documented_module_names_start_the_commands(tmp_path):
    """README's and the train_*.sh scripts' ``python -m`` names, run as a user runs them."""
    hosts = tmp_path / "localserver"
    hosts.write_text("0 127.0.0.1 9999\n")
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.tools.launch", "--solver",
                           "s.prototxt", "--hostfile", str(hosts), "--dry-run"],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "-m poseidon_caffe.tools.supervise -- " in proc.stdout
    assert "-m poseidon_caffe.cli train -solver=s.prototxt" in proc.stdout
    assert os.listdir(tmp_path) == ["localserver"]      # a dry run writes nothing
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.tools.poseidon_run", "--help"],
                          capture_output=True, text=True, cwd=str(tmp_path), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: poseidon-run [-h] -c CLUSTER_CONFIG")


def test_mnist_command_takes_its_folder_from_the_arguments(tmp_path, monkeypatch):
    from poseidon_caffe.tools import mnist
    for name in ("mnist_train_lmdb", "mnist_test_lmdb"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data.mdb").write_bytes(b"")
    monkeypatch.setenv("POSEIDON_CAFFE_CACHE", str(tmp_path / "no_cache"))
    assert mnist.main([str(tmp_path)]) == 0           # both there: nothing fetched or written
    assert sorted(os.listdir(tmp_path)) == ["mnist_test_lmdb", "mnist_train_lmdb"]
