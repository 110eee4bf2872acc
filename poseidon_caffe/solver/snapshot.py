"""Snapshot files in Caffe's formats, written atomically, and read back.

BINARYPROTO: ``<prefix>_iter_N.caffemodel`` (a NetParameter with the learned blobs) and
``<prefix>_iter_N.solverstate`` (a SolverState: iter, learned_net, history, current_step).
HDF5: ``.caffemodel.h5`` (groups ``data/<layer>/<j>``, and ``diff/...`` with snapshot_diff) and
``.solverstate.h5`` (datasets iter, learned_net, current_step and group ``history/<i>``).

Caffe keeps no random state in a snapshot; to make a resumed run bit-identical to an
uninterrupted one, a side file ``<prefix>_iter_N.rngstate`` (JSON) holds the random generator
state and the position of every layer that reports one (``get_resume_state()`` /
``set_resume_state(state)``, e.g. a data layer's cursor). Caffe ignores the extra file. The
solver state is written last: it is what a resume names, so one on disk has its set beside it.
A solver state without its side file is Caffe's when no snapshot of its prefix has one (Caffe
writes none); when others do, this project wrote it and the set is incomplete
(``written_with_side_files``).
"""
import json
import os
import re

import numpy as np

from .. import io as pio
from .. import log, staging
from .. import rng
from ..proto import caffe_pb2

BINARYPROTO = caffe_pb2.SolverParameter.BINARYPROTO
HDF5 = caffe_pb2.SolverParameter.HDF5


class SnapshotError(RuntimeError):
    """A snapshot that cannot be written or read; the message names the file."""


def _h5py():
    try:
        import h5py
    except ImportError:
        raise SnapshotError("snapshot_format HDF5 needs the h5py package, which is not installed "
                            "(pip install h5py, or use snapshot_format: BINARYPROTO)") from None
    return h5py


def model_filename(prefix, it, fmt):
    return "%s_iter_%d%s" % (prefix, it, ".caffemodel.h5" if fmt == HDF5 else ".caffemodel")


def state_filename(prefix, it, fmt):
    return "%s_iter_%d%s" % (prefix, it, ".solverstate.h5" if fmt == HDF5 else ".solverstate")


def rngstate_filename(state_path):
    for ext in (".solverstate.h5", ".solverstate"):
        if state_path.endswith(ext):
            return state_path[:-len(ext)] + ".rngstate"
    return state_path + ".rngstate"


def _atomic_h5(path, fill):
    """Write an HDF5 file through a temporary in the same directory, then rename."""
    h5py = _h5py()
    staging.remove_stale(path)
    tmp = staging.temp_path(path)
    try:
        with h5py.File(tmp, "w") as f:
            fill(f)
        os.replace(tmp, path)
        staging.release(tmp)
    except BaseException:
        staging.discard(tmp)
        raise


# -- model ---------------------------------------------------------------------------------
def write_model(net, path, fmt=BINARYPROTO, write_diff=False):
    if fmt == HDF5:
        def fill(f):
            groups = [("data", False)] + ([("diff", True)] if write_diff else [])
            for group_name, diff in groups:
                group = f.create_group(group_name)
                for layer_name, blobs in net.params.items():
                    layer_group = group.create_group(layer_name)
                    for j, blob in enumerate(blobs):
                        array = blob.host_diff if diff else blob.host_data
                        layer_group.create_dataset(str(j), data=_host(blob, array))
        _atomic_h5(path, fill)
    else:
        pio.atomic_write(path, net.to_proto(write_diff=write_diff).SerializeToString())


def _open_h5(path, what):
    h5py = _h5py()
    if not os.path.exists(path):
        raise SnapshotError("cannot open HDF5 %s %s: no such file" % (what, path))
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        raise SnapshotError("%s: not a readable HDF5 %s (%d bytes): %s"
                            % (path, what, size, exc)) from None


def copy_from_hdf5(net, path, report=True, require_match=True):
    """Copy learned blobs by layer name from a ``.caffemodel.h5`` (Caffe's
    CopyTrainedLayersFromHDF5); returns the names of the layers that received parameters."""
    layer_index = {name: i for i, name in enumerate(net.layer_names)}
    copied = []
    with _open_h5(path, "weights file") as f:
        if "data" not in f:
            raise SnapshotError("%s is not a Caffe HDF5 model: it has no 'data' group" % path)
        data = f["data"]
        for layer_name in data:
            if layer_name not in layer_index:
                log.info("Ignoring source layer %s", layer_name)
                continue
            index = layer_index[layer_name]
            target = net.layers[index].blobs
            source = data[layer_name]
            if len(source) > len(target):
                raise SnapshotError("Incompatible number of blobs for layer %s in %s: the file "
                                    "has %d, the net %d" % (layer_name, path, len(source), len(target)))
            if target:
                log.info("Copying source layer %s", layer_name)
            for j, blob in enumerate(target):
                if str(j) not in source:
                    # Caffe writes a shared parameter only under the layer that owns it
                    if _is_shared(net, index, j):
                        continue
                    raise SnapshotError("Incompatible number of blobs for layer %s in %s: "
                                        "parameter %d is missing" % (layer_name, path, j))
                array = np.asarray(source[str(j)])
                if tuple(array.shape) != tuple(blob.shape):
                    raise SnapshotError(
                        "Cannot copy param %d weights from layer '%s' of %s; shape mismatch. "
                        "Source param shape is %s; target param shape is %s"
                        % (j, layer_name, path, _shape_text(array.shape), blob.shape_string()))
                blob.data[...] = blob.backend.to_device(array)
            if target:
                copied.append(layer_name)
        source_layers = [name for name in data if len(data[name])]
    if require_match:
        net.check_weights_matched(copied, path, source_layers)
    if report:
        net.warn_layers_without_weights(copied, [path])
    return copied


def _is_shared(net, layer_index, j):
    """Whether param j of that layer takes its values from another layer's (weight sharing)."""
    where = (layer_index, j)
    for pid, place in enumerate(net.param_layer_indices):
        if place == where:
            return net.param_owners[pid] != -1
    return False


def load_weights(net, path, report=True, require_match=True):
    """Fine-tune / restore weights into ``net`` by layer name from a .caffemodel or .h5;
    returns the names of the layers that received parameters. A file that gives the net no
    parameter at all is an error naming it; layers left without weights get one warning."""
    if path.endswith(".h5"):
        return copy_from_hdf5(net, path, report, require_match)
    return net.copy_trained_layers_from(path, report, require_match)


def load_weights_files(net, paths, require_match=True, skip=(), message="Loading weights from"):
    """Weights from several files (``-weights a,b``): each must match the net; one warning
    names the layers with parameters that none of them filled (``skip``: layers that get
    their weights elsewhere, e.g. a test net's layers shared with the training net)."""
    paths = [p for p in paths if p]
    copied = []
    for path in paths:
        log.info("%s %s", message, path)
        copied += load_weights(net, path, report=False, require_match=require_match)
    if paths:
        net.warn_layers_without_weights(copied, paths, skip=skip)
    return copied


# -- solver state ----------------------------------------------------------------------------
def write_state(path, it, learned_net, current_step, history, fmt=BINARYPROTO):
    if fmt == HDF5:
        def fill(f):
            f.create_dataset("iter", data=np.int32(it))
            f.create_dataset("learned_net", data=np.bytes_(learned_net.encode("utf-8")))
            f.create_dataset("current_step", data=np.int32(current_step))
            group = f.create_group("history")
            for i, array in enumerate(history):
                group.create_dataset(str(i), data=np.asarray(array))
        _atomic_h5(path, fill)
        return
    state = caffe_pb2.SolverState()
    state.iter = it
    state.learned_net = learned_net
    state.current_step = current_step
    for array in history:
        state.history.add().CopyFrom(pio.array_to_blobproto(np.asarray(array)))
    pio.atomic_write(path, state.SerializeToString())


def read_state(path):
    """-> (iter, learned_net or None, current_step, [history arrays])."""
    if not os.path.exists(path):
        raise SnapshotError("cannot restore solver state from %s: no such file" % path)
    if path.endswith(".h5"):
        with _open_h5(path, "solver state") as f:
            for key in ("iter", "current_step", "history"):
                if key not in f:
                    raise SnapshotError("%s is not a Caffe HDF5 solver state: it has no %r"
                                        % (path, key))
            learned = None
            if "learned_net" in f:
                raw = f["learned_net"][()]
                learned = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            history = [np.asarray(f["history"][str(i)]) for i in range(len(f["history"]))]
            return int(f["iter"][()]), learned, int(f["current_step"][()]), history
    state = pio.read_solverstate(path)
    learned = state.learned_net if state.HasField("learned_net") else None
    history = [pio.blobproto_to_array(bp, source="%s: history blob %d" % (path, i))
               for i, bp in enumerate(state.history)]
    return state.iter, learned, state.current_step, history


def resolve_learned_net(learned_net, state_path):
    """learned_net as Caffe uses it (relative to the working directory); if the snapshot pair
    was moved, the model next to the state file."""
    if os.path.exists(learned_net):
        return learned_net
    beside = os.path.join(os.path.dirname(state_path), os.path.basename(learned_net))
    if os.path.exists(beside):
        return beside
    raise SnapshotError("solver state %s names the model %s, which does not exist (also looked "
                        "for %s)" % (state_path, learned_net, beside))


# -- random state side file ------------------------------------------------------------------
def write_rngstate(state_path, layer_states):
    payload = {"rng": rng.get_state(), "layers": layer_states}
    pio.atomic_write(rngstate_filename(state_path),
                     json.dumps(payload, sort_keys=True).encode("utf-8"))


def read_rngstate(state_path):
    """-> the payload dict, or None when the snapshot has no side file (e.g. made by Caffe)."""
    path = rngstate_filename(state_path)
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            payload = json.loads(f.read().decode("utf-8"))
    except ValueError as exc:
        raise SnapshotError("random state file %s is not valid JSON: %s" % (path, exc)) from None
    except OSError as exc:
        raise SnapshotError("cannot read random state file %s: %s"
                            % (path, exc.strerror or exc)) from None
    _check_rngstate(payload, path)
    return payload


def written_with_side_files(state_path):
    """Whether the run that wrote solver state ``state_path`` wrote random-state side files:
    its iteration has one (its own or a rank's), or another snapshot of its prefix has one.
    This project writes one with every solver state and Caffe never does, so a solver state
    with none anywhere around it is taken as Caffe's."""
    directory, name = os.path.split(os.path.abspath(state_path))
    stem = os.path.basename(rngstate_filename(name))[:-len(".rngstate")]
    numbered = re.match(r"^(.*)_iter_\d+$", stem)
    if numbered:
        side = re.compile(r"^%s_iter_\d+(\.rank\d+)?\.rngstate$" % re.escape(numbered.group(1)))
    else:
        side = re.compile(r"^%s(\.rank\d+)?\.rngstate$" % re.escape(stem))
    try:
        return any(side.match(entry) for entry in os.listdir(directory))
    except OSError:
        return False


def remove_stale_temporaries(prefix):
    """Remove the temporaries that killed writers left of any snapshot file of ``prefix``
    (every iteration's, every rank's; see ``staging``); returns their paths."""
    prefix = os.fspath(prefix)
    family = re.compile(r"^%s_iter_\d+\." % re.escape(os.path.basename(prefix)))
    return staging.remove_stale_where(os.path.dirname(prefix) or ".",
                                      lambda name: family.match(name) is not None)


def _check_rngstate(payload, path):
    """The side file's shape: {"rng": a numpy bit generator state, "layers": {key: {...}}}."""
    if not isinstance(payload, dict) or not isinstance(payload.get("rng"), dict):
        raise SnapshotError("random state file %s holds no 'rng' generator state" % path)
    layers = payload.get("layers", {})
    if not isinstance(layers, dict) or not all(isinstance(v, dict) for v in layers.values()):
        raise SnapshotError("random state file %s: 'layers' is not a mapping of layer states"
                            % path)
    scratch = np.random.default_rng(0).bit_generator
    try:
        scratch.state = payload["rng"]
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise SnapshotError("random state file %s: 'rng' is not a generator state this numpy "
                            "accepts (%s)" % (path, exc)) from None


def _host(blob, array):
    return np.asarray(blob.backend.to_host(array))


def _shape_text(shape):
    count = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    return " ".join(str(s) for s in shape) + " (%d)" % count
