"""Per-layer forward and backward times of a net, as Caffe's ``time`` measures them: every
layer's forward in net order, then every layer's backward in reverse, ``iterations`` times."""
import time


def time_layers(net, iterations, on_iteration=None, clock=time.perf_counter, on_layer=None):
    """{"forward": [seconds per layer], "backward": [...], "forward_total", "backward_total",
    "total"}: sums over ``iterations`` passes (divide for the mean). ``on_iteration(j,
    seconds)`` is called after each forward-backward pass, ``on_layer()`` after each layer's
    forward and each layer's backward (for progress on slow nets). ``clock`` reads the time (on
    a device it waits for the queued work first)."""
    n = len(net.layers)
    forward = [0.0] * n
    backward = [0.0] * n
    forward_total = backward_total = 0.0
    total_start = clock()
    for j in range(iterations):
        iter_start = clock()
        for i in range(n):
            t = clock()
            net.forward_from_to(i, i)
            forward[i] += clock() - t
            if on_layer is not None:
                on_layer()
        forward_total += clock() - iter_start
        backward_start = clock()
        for i in range(n - 1, -1, -1):
            t = clock()
            net.backward_from_to(i, i)
            backward[i] += clock() - t
            if on_layer is not None:
                on_layer()
        backward_total += clock() - backward_start
        if on_iteration is not None:
            on_iteration(j, clock() - iter_start)
    return {"forward": forward, "backward": backward, "forward_total": forward_total,
            "backward_total": backward_total, "total": clock() - total_start}
