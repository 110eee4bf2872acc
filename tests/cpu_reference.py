"""The CPU's pass of a net as reference for a GPU's pass of the same net, weights and inputs.

The two sum in different orders, so a value within their difference of a kink (a ReLU's 0, a
MAX pooling window's runner-up) may fall on the other side of it on one of them and route a
gradient elsewhere: at random weights, LeNet's or CIFAR-10 quick's gradients differed by 0.4%
to 15% in a few runs of a hundred over the stand-in driver, and after 20 SGD steps the weights
by 2e-4 to 1.4e-3 in 3 seeds of 70. From the same input both decide alike.
"""
import time

from poseidon_caffe import backend
from poseidon_caffe.proto import caffe_pb2

_MAX = caffe_pb2.PoolingParameter.MAX


def deciding_as(cpu, gpu):
    """Forward and backward of ``cpu`` (a CPU net), each ReLU and MAX pooling layer taking its
    input from ``gpu``'s forward, already run; the loss. An in-place ReLU's blob holds its output
    by then, which is its own input again where the slope is 0: other slopes are refused."""
    loss = 0.0
    for i, layer in enumerate(cpu.layers):
        kink = layer.type == "ReLU" or (layer.type == "Pooling" and layer.method == _MAX)
        if kink:
            if layer.type == "ReLU" and layer.param.relu_param.negative_slope != 0 and \
                    cpu.bottom_vecs[i][0] is cpu.top_vecs[i][0]:
                raise ValueError("ReLU %r: in place with a negative slope, its output is not "
                                 "its input" % layer.name)
            for mine, theirs in zip(cpu.bottom_vecs[i], gpu.bottom_vecs[i]):
                mine.data[...] = theirs.data
        loss += cpu.forward_from_to(i, i)
    cpu.backward_from_to()
    return loss


def steps_deciding_as(cpu_solver, gpu_solver, steps):
    """``steps`` iterations of both solvers in turn, the GPU's first, the CPU's forward and
    backward each time deciding as the GPU's just did; the seconds each side took."""
    cpu_net, gpu_net = cpu_solver.net, gpu_solver.net
    cpu_net.forward_backward = lambda read_loss=True: deciding_as(cpu_net, gpu_net)
    seconds = {"cpu": 0.0, "gpu": 0.0}
    try:
        for _ in range(steps):
            for mode, solver in (("gpu", gpu_solver), ("cpu", cpu_solver)):
                getattr(backend, "set_mode_" + mode)()
                start = time.time()
                solver.step(1)
                seconds[mode] += time.time() - start
    finally:
        # the net's own method again: the lambda would keep both nets alive in a cycle, and the
        # GPU's memory then freed only by a late collection, with the device gone
        del cpu_net.forward_backward
    return seconds
