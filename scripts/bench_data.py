#!/usr/bin/env python
"""Throughput of the Data layer (LMDB read + decode + transform), and its share of LeNet's
iteration time with prefetch on.

    python scripts/bench_data.py [--seconds 5] [--skip-lenet]

Cases, each on an LMDB of random pixels written to a temporary directory:
  mnist   28x28 grey raw Datum, batch 64, scale 1/256              (LeNet's input)
  imagenet 256x256 colour raw Datum, batch 32, crop 227 + mirror + mean file (AlexNet's input)
  imagenet-jpeg  the same images stored encoded as JPEG (convert_imageset -encoded)
Records per second are measured with prefetch 0, so the number is the work of loading itself.
The LeNet line trains examples/mnist's net on the first case with prefetch 4 and reports the
time forward spends inside the Data layer (waiting for the next batch) against the whole
iteration.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
from google.protobuf import text_format

from poseidon_caffe import log
from poseidon_caffe.blob import Blob
from poseidon_caffe.data.db import DatumWriter
from poseidon_caffe.data.images import encode_image
from poseidon_caffe.data.datasets import mean_to_blobproto
from poseidon_caffe.io import write_blobproto
from poseidon_caffe.layers import create_layer
from poseidon_caffe.proto import caffe_pb2


def write_db(path, count, c, h, w, encoded=False):
    rng = np.random.default_rng(0)
    # smooth-ish images, so JPEG sizes are realistic rather than noise-sized
    base = rng.integers(0, 256, size=(count, c, h // 8 + 1, w // 8 + 1)).astype(np.uint8)
    with DatumWriter(path) as writer:
        for i in range(count):
            image = np.repeat(np.repeat(base[i], 8, axis=1), 8, axis=2)[:, :h, :w]
            if encoded:
                datum = caffe_pb2.Datum(data=encode_image(image.transpose(1, 2, 0), "jpg"),
                                        encoded=True, label=i % 10)
            else:
                datum = caffe_pb2.Datum(channels=c, height=h, width=w, label=i % 10,
                                        data=np.ascontiguousarray(image).tobytes())
            writer.put("%08d" % i, datum)


def data_layer(source, batch, transform, prefetch):
    text = ('name: "data" type: "Data" top: "data" top: "label" transform_param { %s } '
            'data_param { source: "%s" batch_size: %d backend: LMDB prefetch: %d }'
            % (transform, source, batch, prefetch))
    layer = create_layer(text_format.Parse(text, caffe_pb2.LayerParameter()), caffe_pb2.TRAIN)
    top = [Blob(), Blob()]
    layer.setup([], top)
    layer.reshape([], top)
    return layer, top


def records_per_second(source, batch, transform, seconds):
    layer, top = data_layer(source, batch, transform, prefetch=0)
    layer.forward([], top)                 # warm up: first transaction, page cache
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        layer.forward([], top)
        done += batch
    rate = done / (time.perf_counter() - start)
    layer.close()
    return rate


def lenet_share(source, iterations):
    from poseidon_caffe.io import read_net_param
    from poseidon_caffe.net import Net
    here = os.path.dirname(os.path.abspath(__file__))
    net_param = read_net_param(os.path.join(here, os.pardir, "examples", "mnist",
                                            "lenet_train_test.prototxt"))
    for layer in net_param.layer:
        if layer.type == "Data":
            layer.data_param.source = source
            layer.data_param.prefetch = 4
    net = Net(net_param, caffe_pb2.TRAIN)
    last = len(net.layers) - 1
    net.forward_backward()
    data_time = total = 0.0
    for _ in range(iterations):
        t0 = time.perf_counter()
        net.forward_from_to(0, 0)
        t1 = time.perf_counter()
        net.forward_from_to(1, last)
        net.backward_from_to(last, 0)
        t2 = time.perf_counter()
        data_time += t1 - t0
        total += t2 - t0
    net.layers[0].close()
    return data_time / iterations, total / iterations


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="time per case")
    parser.add_argument("--lenet-iters", type=int, default=100)
    parser.add_argument("--skip-lenet", action="store_true")
    args = parser.parse_args(argv)
    log.set_console_level(40)
    with tempfile.TemporaryDirectory() as tmp:
        mnist = os.path.join(tmp, "mnist")
        big = os.path.join(tmp, "big")
        jpeg = os.path.join(tmp, "jpeg")
        write_db(mnist, 2000, 1, 28, 28)
        write_db(big, 200, 3, 256, 256)
        write_db(jpeg, 200, 3, 256, 256, encoded=True)
        mean_path = os.path.join(tmp, "mean.binaryproto")
        write_blobproto(mean_to_blobproto(np.full((3, 256, 256), 120.0)), mean_path)
        big_transform = 'crop_size: 227 mirror: true mean_file: "%s"' % mean_path
        cases = [("mnist 28x28 grey, batch 64, scale", mnist, 64, "scale: 0.00390625"),
                 ("256x256 colour -> crop 227 + mirror + mean, batch 32", big, 32,
                  big_transform),
                 ("256x256 JPEG -> crop 227 + mirror + mean, batch 32", jpeg, 32,
                  big_transform)]
        print("Data layer throughput (prefetch 0, one thread):")
        for name, source, batch, transform in cases:
            rate = records_per_second(source, batch, transform, args.seconds)
            print("  %-55s %9.0f records/s" % (name, rate))
        if not args.skip_lenet:
            data_s, total_s = lenet_share(mnist, args.lenet_iters)
            print("LeNet (batch 64) with prefetch 4: iteration %.1f ms, of which the Data layer "
                  "%.2f ms (%.1f%%)" % (1e3 * total_s, 1e3 * data_s, 100 * data_s / total_s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
