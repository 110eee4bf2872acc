"""Finite-difference gradient checking in the manner of Caffe's GradientChecker.

The objective is a fixed random projection of every top, L = sum_t <W_t, top_t>, so the analytic
gradient is what backward() gives with top diffs set to W_t. Each checked element is perturbed by
+-stepsize and the central difference is compared with the analytic value under Caffe's rule:
|analytic - numeric| <= threshold * max(|analytic|, |numeric|, 1).
"""
import numpy as np

from poseidon_caffe import rng as prng


def _objective(layer, bottom, top, weights, seed):
    prng.set_random_seed(seed)          # layers that draw random numbers draw the same ones
    layer.forward(bottom, top)
    return sum(float(np.dot(t.data.astype(np.float64).ravel(), w.ravel()))
               for t, w in zip(top, weights))


def check_gradient(layer, bottom, top, check_bottom=None, check_params=True, stepsize=1e-2,
                   threshold=1e-2, kink=None, kink_range=-1.0, max_checks=200, seed=1701,
                   setup=True, top_indices=None):
    """Set up ``layer`` on ``bottom``/``top`` (lists of Blob) and check its gradients.

    ``check_bottom``: indices of bottoms to check (default all). ``kink``/``kink_range``: skip
    elements whose *bottom* value lies within kink_range of kink (non-differentiable points).
    ``top_indices``: tops that enter the objective (default all). Raises AssertionError with the
    blob, element and both values on a mismatch.
    """
    rs = np.random.RandomState(seed)
    if setup:
        layer.check_blob_counts(bottom, top)
        layer.setup(bottom, top)
        layer.reshape(bottom, top)
    if check_bottom is None:
        check_bottom = list(range(len(bottom)))
    used = range(len(top)) if top_indices is None else top_indices
    _objective(layer, bottom, top, [np.zeros(t.shape) for t in top], seed)
    weights = [rs.uniform(-1, 1, t.shape) if i in used else np.zeros(t.shape)
               for i, t in enumerate(top)]

    # analytic gradients
    _objective(layer, bottom, top, weights, seed)
    for t, w in zip(top, weights):
        t.diff[...] = w
    for p in layer.blobs:
        p.diff[...] = 0
    propagate = [i in check_bottom for i in range(len(bottom))]
    for b in bottom:
        b.diff[...] = 0
    layer.backward(top, propagate, bottom)
    targets = [("bottom", i, bottom[i]) for i in check_bottom]
    if check_params:
        targets += [("param", i, p) for i, p in enumerate(layer.blobs)]
    analytic = {(kind, i): blob.diff.astype(np.float64).copy() for kind, i, blob in targets}

    for kind, i, blob in targets:
        flat = blob.data.reshape(-1)
        n = flat.size
        picks = np.arange(n) if n <= max_checks else rs.choice(n, max_checks, replace=False)
        grad = analytic[(kind, i)].reshape(-1)
        for j in picks:
            original = flat[j]
            if kind == "bottom" and kink is not None and abs(original - kink) <= kink_range:
                continue
            # blob.data is fetched for every write: on a device backend a host write counts
            # only through the accessor (it makes the host copy the head)
            blob.data.reshape(-1)[j] = original + stepsize
            plus = _objective(layer, bottom, top, weights, seed)
            blob.data.reshape(-1)[j] = original - stepsize
            minus = _objective(layer, bottom, top, weights, seed)
            blob.data.reshape(-1)[j] = original
            numeric = (plus - minus) / (2 * stepsize)
            scale = max(abs(grad[j]), abs(numeric), 1.0)
            if abs(grad[j] - numeric) > threshold * scale:
                raise AssertionError(
                    "%s: gradient of %s %d element %d: analytic %.6g, numeric %.6g"
                    % (layer, kind, i, j, grad[j], numeric))
    _objective(layer, bottom, top, weights, seed)


def blob_from(array):
    from poseidon_caffe.blob import Blob
    array = np.asarray(array, dtype=np.float32)
    b = Blob(array.shape)
    b.data[...] = array
    return b


def make_layer(prototxt):
    """A layer built from the text of one LayerParameter (``name: ... type: ... *_param {}``)."""
    from google.protobuf import text_format
    from poseidon_caffe.layers import create_layer
    from poseidon_caffe.proto import caffe_pb2
    param = text_format.Parse(prototxt, caffe_pb2.LayerParameter())
    return create_layer(param, caffe_pb2.TRAIN if not param.HasField("phase") else param.phase)


def run_layer(layer, bottom, ntops=1):
    """Blob counts checked, then setup, reshape and forward as a net runs them; the tops."""
    from poseidon_caffe.blob import Blob
    top = [Blob() for _ in range(ntops)]
    layer.check_blob_counts(bottom, top)
    layer.setup(bottom, top)
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    return top
