"""CUDABackend's op set on the test driver's device against the CPU backend (rel 1e-5)."""
import numpy as np
import pytest

from poseidon_caffe.backend.cpu import CPUBackend
from poseidon_caffe.backend.cuda import CUDABackend, DeviceArray
from poseidon_caffe.backend.geometry import ConvGeometry, PoolGeometry

from emulated_device import needs_compiler, driver_under_test

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def gpu():
    return CUDABackend(0, driver_under_test())


CPU = CPUBackend()


def rand(shape, seed, lo=-1.0, hi=1.0):
    return np.random.RandomState(seed).uniform(lo, hi, shape).astype(np.float32)


def close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_device_arrays_are_views_and_never_host_memory(gpu):
    x = rand((2, 3, 4), 0)
    d = gpu.to_device(x)
    assert isinstance(d, DeviceArray) and d.shape == (2, 3, 4) and d.nbytes == x.nbytes
    np.testing.assert_array_equal(gpu.to_host(d.reshape(6, -1)), x.reshape(6, 4))
    np.testing.assert_array_equal(gpu.to_host(d.rows(1, 2)), x[1:2])
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(d)
    with pytest.raises(ValueError, match="reshape"):
        d.reshape(5, 5)
    np.testing.assert_array_equal(gpu.to_host(gpu.zeros((3, 2))), np.zeros((3, 2)))


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("beta", [0.0, 1.0, 0.5])
def test_gemm_maps_row_major_onto_column_major(gpu, ta, tb, beta):
    m, n, k = 5, 7, 3
    a = rand((k, m) if ta else (m, k), 1)
    b = rand((n, k) if tb else (k, n), 2)
    c = rand((m, n), 3)
    want = CPU.gemm(a, b, ta, tb, 0.7, beta, c.copy())
    out = gpu.to_device(c)
    gpu.gemm(gpu.to_device(a), gpu.to_device(b), ta, tb, 0.7, beta, out)
    close(gpu.to_host(out), want)
    close(gpu.to_host(gpu.gemm(gpu.to_device(a), gpu.to_device(b), ta, tb)),
          CPU.gemm(a, b, ta, tb))
    assert gpu.sumsq(gpu.to_device(c)) == pytest.approx(CPU.sumsq(c), rel=1e-5)


CONVS = [  # channels, num_output, in, kernel, stride, pad, dilation, group
    (3, 4, (7, 6), (3, 3), (1, 1), (1, 1), (1, 1), 1),
    (4, 6, (9, 8), (3, 2), (2, 1), (0, 1), (1, 1), 2),
    (2, 3, (8, 8), (3, 3), (1, 1), (2, 2), (2, 2), 1),
    (2, 2, (4, 5, 5), (2, 3, 3), (1, 2, 1), (1, 0, 1), (1, 1, 1), 1),
    (6, 4, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 1),
]


@pytest.mark.parametrize("case", CONVS)
def test_conv_plan_forward_and_backward(gpu, case):
    geom = ConvGeometry(*case)
    n = 3
    x = rand((n, geom.channels) + geom.in_shape, 4)
    w = rand(geom.weight_shape, 5)
    bias = rand((geom.num_output,), 6)
    dy = rand((n, geom.num_output) + geom.out_shape, 7)
    cpu_plan = CPU.conv_plan(geom, n)
    y = np.empty(dy.shape, np.float32)
    cpu_plan.forward(x, w, bias, y)
    dx, dw, db = np.empty_like(x), np.ones_like(w), np.ones_like(bias)
    cpu_plan.backward(x, dy, w, dx=dx, dw=dw, dbias=db)

    plan = gpu.conv_plan(geom, n)
    xd, wd = gpu.to_device(x), gpu.to_device(w)
    yd = gpu.empty(dy.shape)
    plan.forward(xd, wd, gpu.to_device(bias), yd)
    close(gpu.to_host(yd), y)
    dxd, dwd, dbd = gpu.empty(x.shape), gpu.to_device(np.ones_like(w)), \
        gpu.to_device(np.ones_like(bias))
    plan.backward(xd, gpu.to_device(dy), wd, dx=dxd, dw=dwd, dbias=dbd)
    close(gpu.to_host(dxd), dx, rtol=1e-4, atol=1e-5)
    close(gpu.to_host(dwd), dw, rtol=1e-4, atol=1e-5)
    close(gpu.to_host(dbd), db, rtol=1e-4, atol=1e-5)
    # im2col / col2im as Caffe's Im2col layer lays them out
    col = gpu.im2col(xd, geom)
    close(gpu.to_host(col), CPU.im2col(x, geom))
    c = CPU.im2col(x, geom)
    close(gpu.to_host(gpu.col2im(gpu.to_device(c), geom)), CPU.col2im(c, geom), atol=1e-5)


POOLS = [((6, 6), (2, 2), (2, 2), (0, 0)), ((7, 5), (3, 3), (2, 2), (1, 1)),
         ((5, 5), (3, 2), (1, 2), (0, 0))]


def _pooled(size, k, s, p):
    out = -(-(size + 2 * p - k) // s) + 1
    return out - 1 if p and (out - 1) * s >= size + p else out


@pytest.mark.parametrize("in_hw,k,s,p", POOLS)
def test_pool_plans(gpu, in_hw, k, s, p):
    out = tuple(_pooled(*v) for v in zip(in_hw, k, s, p))
    geom = PoolGeometry(in_hw, k, s, p, out)
    x = rand((2, 3) + in_hw, 8, 0.0 if not any(p) else -1.0, 1.0)
    dy = rand((2, 3) + out, 9)
    cp, gp = CPU.pool_plan(geom), gpu.pool_plan(geom)
    xd, dyd = gpu.to_device(x), gpu.to_device(dy)
    y, yd = np.empty(dy.shape, np.float32), gpu.empty(dy.shape)
    dx, dxd = np.empty_like(x), gpu.empty(x.shape)
    cp.max_forward(x, y)
    gp.max_forward(xd, yd)
    close(gpu.to_host(yd), y)
    np.testing.assert_array_equal(gpu.to_host(gp.mask()), cp.mask())
    cp.routed_backward(dy, dx)
    gp.routed_backward(dyd, dxd)
    close(gpu.to_host(dxd), dx)
    cp.ave_forward(x, y)
    gp.ave_forward(xd, yd)
    close(gpu.to_host(yd), y)
    cp.ave_backward(dy, dx)
    gp.ave_backward(dyd, dxd)
    close(gpu.to_host(dxd), dx)
    start = rand(x.shape, 11)                        # add=True: dx plus the gradient
    added, addedd = start.copy(), gpu.to_device(start)
    cp.ave_backward(dy, added, add=True)
    gp.ave_backward(dyd, addedd, add=True)
    close(added, start + dx)
    close(gpu.to_host(addedd), start + dx)
    if not any(p):
        uniform = rand(dy.shape, 10, 0.0, 1.0)
        cp.stochastic_forward_train(x, y, uniform)
        gp.stochastic_forward_train(xd, yd, uniform)
        close(gpu.to_host(yd), y)
        cp.routed_backward(dy, dx)
        gp.routed_backward(dyd, dxd)
        close(gpu.to_host(dxd), dx)
        cp.stochastic_forward_test(x, y)
        gp.stochastic_forward_test(xd, yd)
        close(gpu.to_host(yd), y)
        cp.stochastic_backward_test(x, dy, dx)
        gp.stochastic_backward_test(xd, dyd, dxd)
        close(gpu.to_host(dxd), dx, atol=1e-5)


@pytest.mark.parametrize("across", [True, False])
def test_lrn(gpu, across):
    x = rand((2, 7, 5, 6), 11, -2.0, 2.0)
    dy = rand(x.shape, 12)
    top, state = CPU.lrn_forward(x, 5, 0.3, 0.75, 1.5, across)
    dx = CPU.lrn_backward(x, top, state, dy, 5, 0.3, 0.75, across)
    xd = gpu.to_device(x)
    topd, stated = gpu.lrn_forward(xd, 5, 0.3, 0.75, 1.5, across)
    close(gpu.to_host(topd), top)
    dxd = gpu.lrn_backward(xd, topd, stated, gpu.to_device(dy), 5, 0.3, 0.75, across)
    close(gpu.to_host(dxd), dx, atol=1e-5)


def _both(fn_cpu, fn_gpu, gpu, *arrays):
    cpu_arrays = [a.copy() for a in arrays]
    dev = [gpu.to_device(a) for a in arrays]
    r1 = fn_cpu(*cpu_arrays)
    r2 = fn_gpu(*dev)
    return cpu_arrays, [gpu.to_host(d) for d in dev], r1, r2


@pytest.mark.parametrize("inner", [1, 6])
def test_named_light_ops(gpu, inner):
    y = rand((4, 3, inner), 13)
    b = rand((3,), 14)
    for op in ("add_bias", "add_bias_grad"):
        args = (y, b) if op == "add_bias" else (y, b)
        c, g, _, _ = _both(getattr(CPU, op), getattr(gpu, op), gpu, *args)
        for want, got in zip(c, g):
            close(got, want)
    x = rand((4, 3, inner), 15)
    c, g, _, _ = _both(lambda a, b: CPU.axpby(0.3, a, -2.0, b),
                       lambda a, b: gpu.axpby(0.3, a, -2.0, b), gpu, x, y)
    close(g[1], c[1])
    for slope in (0.0, 0.1):
        c, g, _, _ = _both(lambda a, o: CPU.relu_forward(a, o, slope),
                           lambda a, o: gpu.relu_forward(a, o, slope), gpu, x, y)
        close(g[1], c[1])
        c, g, _, _ = _both(lambda a, d, o: CPU.relu_backward(a, d, o, slope),
                           lambda a, d, o: gpu.relu_backward(a, d, o, slope), gpu, x, y, b[:1]
                           * np.ones_like(x))
        close(g[2], c[2])
    c, g, _, _ = _both(CPU.softmax_forward, gpu.softmax_forward, gpu, x, y)
    close(g[1], c[1])
    prob = c[1]
    c, g, _, _ = _both(CPU.softmax_backward, gpu.softmax_backward, gpu, prob, y, x)
    close(g[2], c[2])
    gpu.fill(gpu.to_device(x), 2.5)
    assert gpu.sum(gpu.to_device(x)) == pytest.approx(CPU.sum(x), rel=1e-5)


@pytest.mark.parametrize("ignore", [None, 2])
def test_softmax_loss_and_accuracy(gpu, ignore):
    outer, channels, inner = 5, 4, 3
    prob = CPU.softmax_forward(rand((outer, channels, inner), 16), np.empty((outer, channels,
                                                                             inner), np.float32))
    labels = np.random.RandomState(17).randint(0, channels, (outer, inner)).astype(np.float32)
    pd, ld = gpu.to_device(prob), gpu.to_device(labels)
    loss, count = CPU.softmax_loss_forward(prob, labels, ignore)
    dloss, dcount = gpu.softmax_loss_forward(pd, ld, ignore)
    assert dloss == pytest.approx(loss, rel=1e-5) and dcount == count
    dx = CPU.softmax_loss_backward(prob, labels, ignore, 0.25, np.empty_like(prob))
    dxd = gpu.softmax_loss_backward(pd, ld, ignore, 0.25, gpu.empty(prob.shape))
    close(gpu.to_host(dxd), dx)
    for k in (1, 2):
        want = CPU.accuracy(prob, labels, k, ignore, per_class=True)
        got = gpu.accuracy(pd, ld, k, ignore, per_class=True)
        assert got[:2] == pytest.approx(want[:2])
        close(got[2], want[2])
    bad = labels.copy()
    bad[0, 0] = channels
    assert np.isnan(gpu.softmax_loss_forward(pd, gpu.to_device(bad), None)[0])
    assert np.isnan(CPU.softmax_loss_forward(prob, bad, None)[0])


def test_out_of_device_memory_says_how_many_bytes(gpu, monkeypatch):
    from poseidon_caffe.backend.cuda import DeviceMemoryError
    with pytest.raises(DeviceMemoryError, match="%d bytes asked" % (4 * 2 ** 40)):
        gpu.empty((2 ** 40,))


@pytest.mark.parametrize("kind", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
@pytest.mark.parametrize("regularization", ["L2", "L1"])
def test_solver_update_on_the_device_follows_the_cpu_rules(gpu, kind, regularization):
    from poseidon_caffe.proto import caffe_pb2
    from poseidon_caffe.solver import updates
    param = caffe_pb2.SolverParameter(momentum=0.9, momentum2=0.99, delta=1e-6, rms_decay=0.95)
    data, diff = rand((7, 3), 20), rand((7, 3), 21)
    history = [np.abs(rand((7, 3), 22 + i)) for i in range(2)]
    rate, decay, iteration, iter_size = 0.05, 0.01, 4, 2
    d_data, d_diff = gpu.to_device(data), gpu.to_device(diff)
    d_history = [gpu.to_device(h) for h in history]
    for _ in range(2):
        updates.normalize(diff, iter_size)
        updates.regularize(data, diff, decay, regularization)
        updates.update_value(kind, param, diff, history, rate, iteration)
        data -= diff
        gpu.solver_update(kind, param, d_data, d_diff, d_history, rate, iteration, iter_size,
                          decay, regularization)
        diff = rand((7, 3), 30)
        gpu.upload(diff, d_diff)
    close(gpu.to_host(d_data), data, rtol=1e-5, atol=1e-6)
    for h, dh in zip(history, d_history):
        close(gpu.to_host(dh), h, rtol=1e-5, atol=1e-6)
