"""Caffe's weight fillers: fill a Blob's data in place from a FillerParameter.

Every random draw comes from ``poseidon_caffe.rng.get_rng()`` so that ``random_seed`` makes a
net's initial weights repeatable. Fan sizes follow Caffe: fan_in = count / shape[0] and
fan_out = count / shape[1] (count for a one-axis blob).
"""
import contextlib

import numpy as np

from .proto import caffe_pb2
from .rng import get_rng, set_before_draw

_FP = caffe_pb2.FillerParameter


class FillerError(ValueError):
    """A filler that cannot fill the given blob, or an unknown filler type."""


def _require_dense(filler_param, blob):
    # Caffe's fillers other than gaussian refuse a sparse setting rather than ignore it
    if filler_param.sparse != -1:
        raise FillerError("filler %r does not support sparse (got sparse: %d) for a blob of "
                          "shape %s" % (filler_param.type, filler_param.sparse, blob.shape))


def _fans(blob, filler_type):
    if blob.num_axes < 1 or blob.count == 0:
        raise FillerError("filler %r needs a blob with at least one axis and one value, got "
                          "shape %s" % (filler_type, blob.shape))
    fan_in = blob.count // blob.shape[0]
    fan_out = blob.count // blob.shape[1] if blob.num_axes > 1 else blob.count
    return fan_in, fan_out


def _variance_denominator(blob, filler_param):
    fan_in, fan_out = _fans(blob, filler_param.type)
    norm = filler_param.variance_norm
    if norm == _FP.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if norm == _FP.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def _store(blob, values):
    blob.data[...] = np.asarray(values).reshape(blob.shape)


# Draws are made in float32, the blobs' type: DummyData refills its tops every forward, and
# float64 draws followed by a cast cost twice the time.
def _normal(mean, std, shape):
    values = get_rng().standard_normal(shape, dtype=np.float32)
    values *= np.float32(std)
    values += np.float32(mean)
    return values


def _uniform_draw(low, high, shape):
    values = get_rng().random(shape, dtype=np.float32)
    values *= np.float32(high - low)
    values += np.float32(low)
    return values


def _constant(blob, p):
    _require_dense(p, blob)
    blob.data[...] = p.value


def _uniform(blob, p):
    _require_dense(p, blob)
    if p.max < p.min:
        raise FillerError("uniform filler needs min <= max, got min %g max %g" % (p.min, p.max))
    _store(blob, _uniform_draw(p.min, p.max, blob.shape))


def _gaussian(blob, p):
    rng = get_rng()
    values = _normal(p.mean, p.std, blob.shape)
    if p.sparse >= 0:
        # Caffe: every weight survives with probability sparse / num_outputs, where the
        # outputs are the first axis, so each input keeps about `sparse` non-zero weights
        if blob.num_axes < 1 or blob.shape[0] == 0:
            raise FillerError("sparse gaussian filler needs a blob with a first axis, got "
                              "shape %s" % (blob.shape,))
        keep_probability = p.sparse / float(blob.shape[0])
        values = values * (rng.random(blob.shape) < keep_probability)
    _store(blob, values)


def _positive_unitball(blob, p):
    _require_dense(p, blob)
    if blob.num_axes < 1 or blob.shape[0] == 0:
        raise FillerError("positive_unitball filler needs a blob with a first axis, got shape %s"
                          % (blob.shape,))
    rows = get_rng().random((blob.shape[0], blob.count // blob.shape[0]))
    _store(blob, rows / rows.sum(axis=1, keepdims=True))


def _xavier(blob, p):
    _require_dense(p, blob)
    bound = np.sqrt(3.0 / _variance_denominator(blob, p))
    _store(blob, _uniform_draw(-bound, bound, blob.shape))


def _msra(blob, p):
    _require_dense(p, blob)
    std = np.sqrt(2.0 / _variance_denominator(blob, p))
    _store(blob, _normal(0.0, std, blob.shape))


def _bilinear(blob, p):
    _require_dense(p, blob)
    if blob.num_axes != 4 or blob.shape[2] != blob.shape[3]:
        raise FillerError("bilinear filler needs a 4-axis blob with equal height and width, "
                          "got shape %s" % (blob.shape,))
    size = blob.shape[3]
    factor = int(np.ceil(size / 2.0))
    center = (2 * factor - 1 - factor % 2) / (2.0 * factor)
    ramp = 1.0 - np.abs(np.arange(size) / factor - center)
    # the same 2-d kernel in every (output, input) channel pair
    _store(blob, np.broadcast_to(np.outer(ramp, ramp), blob.shape))


_FILLERS = {
    "constant": _constant,
    "gaussian": _gaussian,
    "uniform": _uniform,
    "positive_unitball": _positive_unitball,
    "xavier": _xavier,
    "msra": _msra,
    "bilinear": _bilinear,
}


def filler_types():
    return sorted(_FILLERS)


def fill(blob, filler_param=None):
    """Fill ``blob.data`` as Caffe's filler named by ``filler_param.type`` would (or, inside
    ``deferred()``, when the blob is first used, keeping the order of the random draws)."""
    if filler_param is None:
        filler_param = _FP()
    try:
        filler = _FILLERS[filler_param.type]
    except KeyError:
        raise FillerError("Unknown filler type %r; known types: %s"
                          % (filler_param.type, ", ".join(filler_types()))) from None
    if _deferral["depth"] and not blob.allocated:
        _deferral["pending"].append((blob, filler, filler_param))
        blob.before_first_use = run_deferred_fills
        set_before_draw(run_deferred_fills)
        return blob
    filler(blob, filler_param)
    return blob


# -- deferred filling: a net is shaped and its memory counted before any weight exists --------
_deferral = {"depth": 0, "pending": [], "running": False}


class DeferredFillError(FillerError):
    """A deferred fill that failed; ``blob`` is the blob it was for (to name its layer);
    ``out_of_memory``: the failure was an allocation."""

    def __init__(self, message, blob, out_of_memory=False):
        super().__init__(message)
        self.blob = blob
        self.out_of_memory = out_of_memory


def run_deferred_fills():
    """Make every queued fill now, in the order they were asked for."""
    if _deferral["running"]:
        return              # a filler's own draw: the queue is already being worked off
    _deferral["running"] = True
    try:
        pending = _deferral["pending"]
        while pending:
            blob, filler, filler_param = pending.pop(0)
            blob.before_first_use = None
            try:
                filler(blob, filler_param)
            except FillerError as exc:
                raise DeferredFillError(str(exc), blob) from exc
            except (MemoryError, ValueError) as exc:
                # numpy says "array is too big" when a shape's byte count overflows
                if not isinstance(exc, MemoryError) and "array is too big" not in str(exc):
                    raise
                raise DeferredFillError("out of memory drawing the initial values of a blob "
                                        "of shape %s (%s)" % (tuple(blob.shape), exc), blob,
                                        out_of_memory=True) from exc
    finally:
        _deferral["running"] = False
        if not _deferral["pending"]:
            set_before_draw(None)


@contextlib.contextmanager
def deferred():
    """Within, fills of blobs that have no storage yet wait until the blob is first used, a
    random draw is made elsewhere, or the block ends; leaving by an exception drops them."""
    _deferral["depth"] += 1
    ok = False
    try:
        yield
        ok = True
    finally:
        _deferral["depth"] -= 1
        if _deferral["depth"] == 0:
            if ok:
                run_deferred_fills()
            else:
                for blob, _, _ in _deferral["pending"]:
                    blob.before_first_use = None
                del _deferral["pending"][:]
                set_before_draw(None)


def constant_filler(value):
    """A FillerParameter of type constant: the default Caffe layers substitute for a missing one."""
    return _FP(type="constant", value=value)
