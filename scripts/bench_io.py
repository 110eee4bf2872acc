"""Save and load AlexNet-size weights (about 61M floats over 16 blobs) through io.

Reports wall time of each half and the peak resident memory above the arrays themselves
(the VmHWM high-water mark, reset at the start, minus the resident size then, measured in a fresh child process per half so that one
half's peak does not hide the other's).

    python scripts/bench_io.py [--dir DIR]
"""
import argparse
import multiprocessing as mp
import os
import resource
import tempfile
import time

import numpy as np

# AlexNet (CaffeNet) parameter shapes: conv1..5 and fc6..8, weights and biases.
ALEXNET_SHAPES = [
    ("conv1", (96, 3, 11, 11), (96,)), ("conv2", (256, 48, 5, 5), (256,)),
    ("conv3", (384, 256, 3, 3), (384,)), ("conv4", (384, 192, 3, 3), (384,)),
    ("conv5", (256, 192, 3, 3), (256,)), ("fc6", (4096, 9216), (4096,)),
    ("fc7", (4096, 4096), (4096,)), ("fc8", (1000, 4096), (1000,)),
]


def _reset_peak():
    # Linux: writing 5 to clear_refs resets the high-water mark (VmHWM) to the current size.
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _make_arrays():
    rng = np.random.default_rng(0)
    return {name: [rng.standard_normal(w, dtype=np.float32),
                   rng.standard_normal(b, dtype=np.float32)]
            for name, w, b in ALEXNET_SHAPES}


def _save(path, queue):
    from poseidon_caffe import io
    from poseidon_caffe.proto import caffe_pb2
    arrays = _make_arrays()
    _reset_peak()
    base = _current_rss_bytes()
    t0 = time.perf_counter()
    net = caffe_pb2.NetParameter(name="AlexNet")
    for name in arrays:
        net.layer.add(name=name, type="Convolution" if name.startswith("conv")
                      else "InnerProduct")
    io.write_net_weights(net, arrays, path)
    elapsed = time.perf_counter() - t0
    queue.put(("save", elapsed, _peak_rss_bytes() - base))


def _load(path, queue):
    from poseidon_caffe import io
    _reset_peak()
    base = _current_rss_bytes()
    t0 = time.perf_counter()
    net, arrays = io.read_net_weights(path)
    del net
    elapsed = time.perf_counter() - t0
    peak = _peak_rss_bytes() - base
    expected = _make_arrays()
    same = all(np.array_equal(a, e) for name in expected
               for a, e in zip(arrays[name], expected[name]))
    # The general proto path, for comparison.
    t1 = time.perf_counter()
    net = io.read_net_binary(path)
    proto_arrays = [io.blobproto_to_array(b) for layer in net.layer for b in layer.blobs]
    t_proto = time.perf_counter() - t1
    same = same and all(np.array_equal(a, b) for a, b in
                        zip(proto_arrays, [a for name in expected for a in expected[name]]))
    queue.put(("load", elapsed, peak, same, t_proto))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write the temporary model")
    args = parser.parse_args()
    count = sum(int(np.prod(w)) + int(np.prod(b)) for _, w, b in ALEXNET_SHAPES)
    size = count * 4
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "alexnet.caffemodel")
        results = {}
        for target in (_save, _load):
            queue = ctx.Queue()
            proc = ctx.Process(target=target, args=(path, queue))
            proc.start()
            result = queue.get()
            proc.join()
            results[result[0]] = result
        file_size = os.path.getsize(path)
    from poseidon_caffe.memory import format_bytes
    print("weights: %d floats in %d blobs = %s; file %s"
          % (count, 2 * len(ALEXNET_SHAPES), format_bytes(size), format_bytes(file_size)))
    _, t_save, m_save = results["save"]
    _, t_load, m_load, same, t_proto = results["load"]
    print("save: %.2f s, peak extra memory %s (%.2fx the weights)"
          % (t_save, format_bytes(m_save), m_save / size))
    print("load: %.2f s, peak extra memory %s (%.2fx the weights, incl. the returned "
          "arrays), bit-equal: %s" % (t_load, format_bytes(m_load), m_load / size, same))
    print("save+load: %.2f s  (read_net_binary + blobproto_to_array instead: %.2f s)"
          % (t_save + t_load, t_proto))


if __name__ == "__main__":
    main()
