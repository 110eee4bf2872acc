"""PyTorch's time for each memory-bound layer that roofline.py reports, on the same shapes.

    python scripts/roofline.py --torch PYTHON ...     (runs this with PYTHON, which has torch)

roofline.py describes each Pooling, LRN, ReLU, Dropout, Eltwise, Concat, Softmax and
SoftmaxWithLoss layer as a plain dict (its type, its inputs' shapes and its parameters); this
worker, in a process that imports torch and neither protobuf nor this project, builds the
same operation in PyTorch and times it alone on random inputs: the forward, and the backward
as autograd runs it (torch.autograd.grad of the output against the inputs with a random top
gradient), each the best of N calls after one untimed call. Ours is timed in the net's flow,
one call an iteration among the other layers (its inputs often cold in the cache); PyTorch's
here in a loop, its inputs warm: a comparison that favours PyTorch.

PyTorch's counterparts: ReLU -> relu or leaky_relu, Dropout -> dropout (training), Pooling ->
max_pool2d / avg_pool2d with ceil_mode (Caffe's rounding) and count_include_pad, global
pooling as a window of the whole map, LRN (across channels) -> local_response_norm, Concat ->
cat, Eltwise -> sum with coefficients, product or maximum, Softmax -> softmax,
SoftmaxWithLoss -> cross_entropy. A layer with none (LRN within a channel) gets null.
"""
import json
import sys
import time

ELTWISE_PROD, ELTWISE_SUM, ELTWISE_MAX = 0, 1, 2       # Caffe's EltwiseOp numbers
POOL_MAX = 0


def _operation(op, torch):
    """(inputs, forward function of no arguments) for one described layer, or None."""
    import torch.nn.functional as F
    kind, shapes = op["type"], op["bottoms"]
    gen = torch.Generator().manual_seed(0)

    def leaf(shape):
        return torch.randn(*shape, generator=gen).requires_grad_(True)

    if kind == "SoftmaxWithLoss":
        scores = leaf(shapes[0])
        axis = op["axis"]
        # cross_entropy takes the classes on axis 1: the outer axes folded, the inner kept
        outer = 1
        for n in shapes[0][:axis]:
            outer *= n
        folded = [outer, shapes[0][axis]] + list(shapes[0][axis + 1:])
        labels = torch.randint(0, shapes[0][axis], [folded[0]] + folded[2:], generator=gen)
        return [scores], lambda: F.cross_entropy(scores.reshape(folded), labels)
    xs = [leaf(s) for s in shapes]
    x = xs[0]
    if kind == "ReLU":
        slope = op["slope"]
        return xs, (lambda: F.leaky_relu(x, slope)) if slope else (lambda: F.relu(x))
    if kind == "Dropout":
        return xs, lambda: F.dropout(x, op["ratio"], True)
    if kind == "Pooling":
        k, s, p = op["kernel"], op["stride"], op["pad"]
        if op["method"] == POOL_MAX:
            return xs, lambda: F.max_pool2d(x, k, s, p, ceil_mode=True)
        return xs, lambda: F.avg_pool2d(x, k, s, p, ceil_mode=True, count_include_pad=True)
    if kind == "LRN":
        if not op["across_channels"]:
            return None
        return xs, lambda: F.local_response_norm(x, op["size"], op["alpha"], op["beta"],
                                                 op["k"])
    if kind == "Concat":
        return xs, lambda: torch.cat(xs, op["axis"])
    if kind == "Softmax":
        return xs, lambda: F.softmax(x, op["axis"])
    if kind == "Eltwise":
        if op["operation"] == ELTWISE_SUM:
            def total():
                out = xs[0] * op["coeffs"][0]
                for c, y in zip(op["coeffs"][1:], xs[1:]):
                    out = out + c * y
                return out
            return xs, total
        combine = torch.mul if op["operation"] == ELTWISE_PROD else torch.maximum

        def fold():
            out = xs[0]
            for y in xs[1:]:
                out = combine(out, y)
            return out
        return xs, fold
    return None


def best_of(fn, calls):
    """Seconds of ``fn``'s fastest call of ``calls``, after one untimed call (roofline.py times
    ours alone with it too)."""
    fn()
    best = float("inf")
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_operations(ops, calls, threads):
    """[[forward s, backward s] or None] for each described layer (backward 0 where the net
    runs none through it)."""
    import torch
    torch.set_num_threads(threads)
    times = []
    for op in ops:
        made = _operation(op, torch)
        if made is None:
            times.append(None)
            continue
        inputs, forward = made
        forward_s = best_of(forward, calls)
        backward_s = 0.0
        if op["backward"]:
            out = forward()
            grad = torch.ones_like(out) if out.dim() == 0 else torch.randn_like(out)
            backward_s = best_of(lambda: torch.autograd.grad(out, inputs, grad,
                                                             retain_graph=True), calls)
        times.append([forward_s, backward_s])
        del made, inputs, forward
    return times


def main(argv):
    """--worker FILE CALLS THREADS: FILE holds the described layers; prints RESULT json."""
    if len(argv) != 4 or argv[0] != "--worker":
        sys.stderr.write("usage: peer_layers.py --worker FILE CALLS THREADS "
                         "(roofline.py --torch runs it)\n")
        return 2
    with open(argv[1]) as f:
        ops = json.load(f)
    print("RESULT " + json.dumps(time_operations(ops, int(argv[2]), int(argv[3]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
