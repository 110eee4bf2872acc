"""A net's weights as Caffe's HDF5 model file (pycaffe's ``Net.save_hdf5`` / ``load_hdf5``).

Layout, as Caffe's Net::ToHDF5 writes it: a group ``data`` (and ``diff`` when diffs are
written) holding one group per layer of the net, named after the layer, and in it one float32
dataset per parameter, named by its index ("0", "1", ...). A parameter that another layer owns
(weight sharing) is written only under its owner; loading skips it where the file lacks it.
"""
import os

import numpy as np

from . import log, staging


class HDF5WeightsError(ValueError):
    """An HDF5 weights file that does not fit the net; the message names the file and layer."""


def _h5py():
    try:
        import h5py
    except ImportError:
        raise HDF5WeightsError("HDF5 weights need the h5py package, which is not installed "
                               "(pip install h5py)") from None
    return h5py


def _owned(net):
    """{(layer index, param index): whether that layer owns the parameter}."""
    return {place: net.param_owners[pid] == -1
            for pid, place in enumerate(net.param_layer_indices)}


def save(net, path, write_diff=False):
    h5py = _h5py()
    owned = _owned(net)
    # a temporary beside the target, renamed over it when complete; ones killed writers left
    # there are removed first (see staging)
    staging.remove_stale(path)
    temp = staging.temp_path(path)
    try:
        with h5py.File(temp, "w") as f:
            for group_name in ("data", "diff") if write_diff else ("data",):
                group = f.create_group(group_name)
                for i, (name, layer) in enumerate(zip(net.layer_names, net.layers)):
                    layer_group = group.create_group(name)
                    for j, blob in enumerate(layer.blobs):
                        if owned.get((i, j), True):
                            array = blob.diff if group_name == "diff" else blob.data
                            layer_group.create_dataset(
                                str(j), data=np.asarray(blob.backend.to_host(array),
                                                        dtype=np.float32))
        os.replace(temp, path)
        staging.release(temp)
    except BaseException:
        staging.discard(temp)
        raise


def load(net, path):
    h5py = _h5py()
    if not os.path.exists(path):
        raise HDF5WeightsError("cannot open HDF5 weights file %s: no such file" % path)
    owned = _owned(net)
    index_of = {name: i for i, name in enumerate(net.layer_names)}
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise HDF5WeightsError("%s is not a readable HDF5 file (%s)" % (path, exc)) from None
    with f:
        if "data" not in f:
            raise HDF5WeightsError("%s is not a Caffe HDF5 model: it has no 'data' group" % path)
        for name, source in f["data"].items():
            if name not in index_of:
                log.info("Ignoring source layer %s", name)
                continue
            i = index_of[name]
            targets = net.layers[i].blobs
            if len(source) > len(targets):
                raise HDF5WeightsError("Incompatible number of blobs for layer %s: %s holds %d, "
                                       "the net has %d" % (name, path, len(source), len(targets)))
            for j, blob in enumerate(targets):
                if str(j) not in source:
                    if not owned.get((i, j), True):
                        continue
                    raise HDF5WeightsError("Incompatible number of blobs for layer %s: %s lacks "
                                           "parameter %d" % (name, path, j))
                array = np.asarray(source[str(j)])
                if array.size != blob.count:
                    raise HDF5WeightsError(
                        "Cannot copy param %d of layer %s from %s: the file holds shape %s, the "
                        "net %s" % (j, name, path, list(array.shape), list(blob.shape)))
                blob.data[...] = blob.backend.to_device(
                    array.astype(np.float32).reshape(blob.shape))
