"""The net's errors, and how a failure inside one layer becomes one naming that layer."""


class NetError(ValueError):
    """A net that cannot be built as written; the message names the layer and blob."""


class NetMemoryError(NetError):
    """A net that does not fit in memory, found before allocating or where an allocation
    failed; the message names the net or the layer and the amounts."""


def is_project_error(exc):
    """Whether ``exc`` is one of this project's error classes (they name their own place)."""
    return type(exc).__module__.split(".")[0] == __name__.split(".")[0]


def reraise_user_error(layer_type, layer_name, what, exc):
    """A Python layer's own exception is the user's code speaking: it keeps its type, as
    pycaffe gives it, with a note naming the layer (out of memory is still the project's)."""
    if layer_type != "Python" or isinstance(exc, MemoryError) or is_project_error(exc):
        return
    if hasattr(exc, "add_note"):
        exc.add_note("in %s of Python layer %r" % (what, layer_name))
    raise exc


def raise_if_out_of_memory(layer, what, exc):
    if isinstance(exc, MemoryError) or "array is too big" in str(exc):
        raise layer_failure(layer, what, exc) from exc


def layer_failure(layer, what, exc):
    """A failure inside one layer as the project's error naming it (project errors pass)."""
    if is_project_error(exc) and not isinstance(exc, MemoryError):
        return exc
    if isinstance(exc, MemoryError) or "array is too big" in str(exc):
        # numpy says "array is too big" when a shape's byte count overflows
        return NetMemoryError("layer %r of type %s: out of memory in %s (%s)"
                              % (layer.name, layer.type, what, str(exc) or "MemoryError"))
    return NetError("layer %r of type %s failed in %s: %s: %s"
                    % (layer.name, layer.type, what, type(exc).__name__, exc))
