"""Weights that do not fit the net are never accepted in silence: a file that gives the net no
parameter is an error naming it (an empty file too), and layers a file leaves without weights
are named in one warning — through pycaffe's Net, the solver and the command line."""
import contextlib
import logging
import subprocess
import sys

import numpy as np
import pytest

from poseidon_caffe import TEST, TRAIN
from poseidon_caffe.io import ProtoFileError
from poseidon_caffe.net import Net, NetError
from poseidon_caffe.solver import get_solver
from poseidon_caffe.solver.snapshot import SnapshotError, load_weights_files, write_model, HDF5

INPUT = ('layer { name: "data" type: "Input" top: "data" '
         'input_param { shape { dim: 2 dim: 3 } } }\n')


def ip(name, bottom, num_output, top=None):
    return ('layer { name: "%s" type: "InnerProduct" bottom: "%s" top: "%s" '
            'inner_product_param { num_output: %d weight_filler { type: "gaussian" std: 1 } '
            'bias_filler { type: "constant" value: 0.5 } } }\n'
            % (name, bottom, top or name, num_output))


def write_net(tmp_path, filename, *layer_names):
    """An Input, then InnerProduct layers 3 -> 4 -> 2 under the given names."""
    first, second = layer_names
    text = 'name: "mlp"\n' + INPUT + ip(first, "data", 4, "h") + ip(second, "h", 2, "out")
    path = tmp_path / filename
    path.write_text(text)
    return str(path)


def trained_model(tmp_path):
    """A model file of layers fc1 and fc2 with known values (fc1 weights 1..12)."""
    net = Net(write_net(tmp_path, "source.prototxt", "fc1", "fc2"), TEST)
    net.params["fc1"][0].data[...] = np.arange(1, 13, dtype=np.float32).reshape(4, 3)
    net.params["fc2"][0].data[...] = 7.0
    path = str(tmp_path / "trained.caffemodel")
    net.save(path)
    return path


@contextlib.contextmanager
def warnings_logged():
    """The WARNING records of the project's logger inside the block."""
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno == logging.WARNING:
                records.append(record.getMessage())

    handler = Keep()
    logger = logging.getLogger("poseidon_caffe")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def test_weights_matching_no_layer_are_an_error_naming_the_file(tmp_path):
    model = trained_model(tmp_path)
    other = write_net(tmp_path, "other.prototxt", "encoder", "decoder")
    with pytest.raises(NetError) as info:
        Net(other, model, TEST)
    message = str(info.value)
    assert model in message and "no parameter copied into net 'mlp'" in message
    # both sides are listed, so the user sees the renamed layers
    assert "fc1, fc2" in message and "encoder, decoder" in message
    net = Net(other, TEST)
    with pytest.raises(NetError, match="no parameter copied"):
        net.copy_from(model)


def test_an_empty_caffemodel_is_an_error_naming_the_file(tmp_path):
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    net_file = write_net(tmp_path, "net.prototxt", "fc1", "fc2")
    with pytest.raises(ProtoFileError, match=r"empty\.caffemodel: empty file \(0 bytes\)"):
        Net(net_file, str(empty), TEST)


def test_a_partial_match_copies_what_matches_and_warns_once(tmp_path):
    model = trained_model(tmp_path)
    partial = write_net(tmp_path, "partial.prototxt", "fc1", "classifier")
    with warnings_logged() as warnings:
        net = Net(partial, model, TEST)
    np.testing.assert_array_equal(net.params["fc1"][0].data,
                                  np.arange(1, 13, dtype=np.float32).reshape(4, 3))
    assert warnings == ["1 layer(s) with parameters got no weights from %s and keep their "
                        "initial values: classifier" % model]


def test_two_files_together_cover_the_net_without_a_warning(tmp_path):
    model = trained_model(tmp_path)
    # a second file holding only fc2 (value 3): the later file wins for fc2, as in Caffe
    half = Net(write_net(tmp_path, "half.prototxt", "unused", "fc2"), TEST)
    half.params["fc2"][0].data[...] = 3.0
    half_path = str(tmp_path / "half.caffemodel")
    half.save(half_path)
    with warnings_logged() as warnings:
        net = Net(write_net(tmp_path, "net.prototxt", "fc1", "fc2"), TEST)
        load_weights_files(net, [model, half_path])
    assert warnings == []
    assert net.params["fc1"][0].data[0, 0] == 1.0 and np.all(net.params["fc2"][0].data == 3.0)


def test_hdf5_weights_matching_no_layer_are_an_error_naming_the_file(tmp_path):
    pytest.importorskip("h5py")
    source = Net(write_net(tmp_path, "source.prototxt", "fc1", "fc2"), TEST)
    h5 = str(tmp_path / "trained.caffemodel.h5")
    write_model(source, h5, HDF5)
    net = Net(write_net(tmp_path, "other.prototxt", "encoder", "decoder"), TEST)
    with pytest.raises(NetError, match=r"trained\.caffemodel\.h5: no parameter copied"):
        load_weights_files(net, [h5])
    empty = tmp_path / "empty.caffemodel.h5"
    empty.write_bytes(b"")
    with pytest.raises(SnapshotError, match=r"empty\.caffemodel\.h5: not a readable HDF5 "
                                            r"weights file \(0 bytes\)"):
        load_weights_files(net, [str(empty)])


def solver_text(net_file, weights):
    return ('net: "%s" base_lr: 0.1 lr_policy: "fixed" max_iter: 1 test_iter: 1 '
            'test_interval: 100 weights: "%s"' % (net_file, weights))


def test_solver_weights_are_checked_once_for_the_training_net(tmp_path):
    model = trained_model(tmp_path)
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(solver_text(write_net(tmp_path, "other.prototxt", "a", "b"), model))
    with pytest.raises(NetError, match="no parameter copied into net 'mlp'"):
        get_solver(str(solver_file))
    # the test net shares fc1 and fc3 with the training net: one warning, not one per net
    solver_file.write_text(solver_text(write_net(tmp_path, "net.prototxt", "fc1", "fc3"), model))
    with warnings_logged() as warnings:
        solver = get_solver(str(solver_file))
    assert warnings == ["1 layer(s) with parameters got no weights from %s and keep their "
                        "initial values: fc3" % model]
    assert solver.net.params["fc1"][0].data[3, 2] == 12.0
    assert solver.net.phase == TRAIN


def run_cli(tmp_path, *args):
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli"] + list(args),
                          cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


def test_cli_test_and_train_refuse_weights_that_match_nothing(tmp_path):
    model = trained_model(tmp_path)
    other = write_net(tmp_path, "other.prototxt", "encoder", "decoder")
    code, err = run_cli(tmp_path, "test", "-model", other, "-weights", model, "-iterations", "1")
    assert code == 1
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("E")]
    assert len(errors) == 1 and model in errors[0] and "no parameter copied" in errors[0]
    code, err = run_cli(tmp_path, "time", "-model", other, "-weights", model, "-iterations", "1")
    assert code == 1 and "Traceback" not in err and "no parameter copied" in err
    (tmp_path / "empty.caffemodel").write_bytes(b"")
    (tmp_path / "solver.prototxt").write_text(
        'net: "%s" base_lr: 0.1 lr_policy: "fixed" max_iter: 2' % other)
    code, err = run_cli(tmp_path, "train", "-solver", "solver.prototxt",
                        "-weights", "empty.caffemodel")
    assert code == 1 and "Traceback" not in err
    assert "empty.caffemodel: empty file (0 bytes)" in err


@pytest.mark.parametrize("reader, kind", [
    ("read_net_binary", ".caffemodel (NetParameter)"),
    ("read_net_weights", ".caffemodel (NetParameter)"),
    ("read_solverstate", ".solverstate (SolverState)"),
    ("read_blobproto", "BlobProto (.binaryproto) (BlobProto)"),
])
def test_every_binary_reader_refuses_an_empty_file(tmp_path, reader, kind):
    from poseidon_caffe import io as pio
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(ProtoFileError) as info:
        getattr(pio, reader)(str(empty))
    assert str(info.value) == "%s: empty file (0 bytes), expected a binary %s" % (empty, kind)
