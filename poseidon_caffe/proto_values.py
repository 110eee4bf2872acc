"""Checks on the numbers a prototxt carries, shared by net building and the solver.

The text format accepts ``nan`` and ``inf`` for every float field; no Caffe parameter means
anything with them, and they would only surface later as a NaN loss far from their cause.
"""
import math

from google.protobuf.descriptor import FieldDescriptor

from .proto import is_repeated

_FLOATS = (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE)


def non_finite_fields(message, skip=(), prefix=""):
    """[(dotted field path, value)] of every NaN or infinite float field set in ``message``,
    nested messages included; field names in ``skip`` are not entered (e.g. weight blobs)."""
    found = []
    for field, value in message.ListFields():
        if field.name in skip:
            continue
        path = prefix + field.name
        repeated = is_repeated(field)
        if field.type in _FLOATS:
            values = value if repeated else [value]
            for i, v in enumerate(values):
                if not math.isfinite(v):
                    found.append(("%s[%d]" % (path, i) if repeated else path, v))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            items = value if repeated else [value]
            for i, item in enumerate(items):
                where = "%s[%d]." % (path, i) if repeated else path + "."
                found.extend(non_finite_fields(item, skip, where))
    return found


def describe_non_finite(found):
    """'power_param.power = nan, loss_weight[0] = inf' for an error message."""
    return ", ".join("%s = %s" % (path, value) for path, value in found)
