"""Per-layer forward and backward times of a net, as Caffe's ``time`` measures them: every
layer's forward in net order, then every layer's backward in reverse, ``iterations`` times."""
import time


def time_layers(net, iterations, on_iteration=None):
    """{"forward": [seconds per layer], "backward": [...], "forward_total", "backward_total",
    "total"}: sums over ``iterations`` passes (divide for the mean). ``on_iteration(j,
    seconds)`` is called after each forward-backward pass."""
    n = len(net.layers)
    forward = [0.0] * n
    backward = [0.0] * n
    forward_total = backward_total = 0.0
    total_start = time.perf_counter()
    for j in range(iterations):
        iter_start = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            net.forward_from_to(i, i)
            forward[i] += time.perf_counter() - t
        forward_total += time.perf_counter() - iter_start
        backward_start = time.perf_counter()
        for i in range(n - 1, -1, -1):
            t = time.perf_counter()
            net.backward_from_to(i, i)
            backward[i] += time.perf_counter() - t
        backward_total += time.perf_counter() - backward_start
        if on_iteration is not None:
            on_iteration(j, time.perf_counter() - iter_start)
    return {"forward": forward, "backward": backward, "forward_total": forward_total,
            "backward_total": backward_total, "total": time.perf_counter() - total_start}
