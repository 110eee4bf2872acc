"""Writes the TRAIN nets the simulator's paper comparison uses beside AlexNet and GoogLeNet
(examples/alexnet, examples/googlenet): VGG19 with a 21,841-way classifier (ImageNet-22K's
classes; Simonyan & Zisserman 2014, configuration E) and Inception-V3 (Szegedy et al. 2015,
"Rethinking the Inception architecture", with its auxiliary classifier). Input layers stand
for the data (batch 32, as the paper's runs), so the nets load without a dataset; what the
simulator needs of them is their parameter shapes and the work of each layer.
Run: python examples/simulation/make_prototxt.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from poseidon_caffe.io import write_text_proto  # noqa: E402
from poseidon_caffe.net_spec import L, NetSpec  # noqa: E402

LEARNING = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]
FROZEN = [dict(lr_mult=0, decay_mult=0)] * 3        # BatchNorm's statistics are not learnt


def inputs(n, batch, size):
    n.data, n.label = L.Input(ntop=2, shape=[dict(dim=[batch, 3, size, size]),
                                             dict(dim=[batch])])


def vgg19_22k(batch=32):
    n = NetSpec()
    inputs(n, batch, 224)
    top = "data"
    for block, (width, depth) in enumerate([(64, 2), (128, 2), (256, 4), (512, 4), (512, 4)], 1):
        for k in range(1, depth + 1):
            name = "conv%d_%d" % (block, k)
            n[name] = L.Convolution(n[top], param=LEARNING, num_output=width, kernel_size=3,
                                    pad=1, weight_filler=dict(type="xavier"))
            n["relu%d_%d" % (block, k)] = L.ReLU(n[name], in_place=True)
            top = name
        n["pool%d" % block] = L.Pooling(n[top], pool="MAX", kernel_size=2, stride=2)
        top = "pool%d" % block
    for name, width in (("fc6", 4096), ("fc7", 4096)):
        n[name] = L.InnerProduct(n[top], param=LEARNING, num_output=width,
                                 weight_filler=dict(type="gaussian", std=0.005))
        n["relu" + name[2:]] = L.ReLU(n[name], in_place=True)
        n["drop" + name[2:]] = L.Dropout(n[name], dropout_ratio=0.5, in_place=True)
        top = name
    n.fc8 = L.InnerProduct(n[top], param=LEARNING, num_output=21841,
                           weight_filler=dict(type="gaussian", std=0.01))
    n.loss = L.SoftmaxWithLoss(n.fc8, n.label)
    net = n.to_proto()
    net.name = "VGG19-22K"
    return net


def conv_bn(n, name, bottom, num, kernel, stride=1, pad=0):
    """Convolution (its bias is batch norm's shift), batch normalisation, ReLU. ``kernel`` and
    ``pad`` are a number or (height, width)."""
    kh, kw = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    ph, pw = pad if isinstance(pad, tuple) else (pad, pad)
    geometry = dict(kernel_size=kh, pad=ph) if (kh, ph) == (kw, pw) else \
        dict(kernel_h=kh, kernel_w=kw, pad_h=ph, pad_w=pw)
    if stride != 1:
        geometry["stride"] = stride
    n[name] = L.Convolution(n[bottom], param=LEARNING, num_output=num,
                            weight_filler=dict(type="xavier"), **geometry)
    n[name + "/bn"] = L.BatchNorm(n[name], param=FROZEN, in_place=True)
    n[name + "/relu"] = L.ReLU(n[name], in_place=True)
    return name


def pool(n, name, bottom, kind, kernel, stride, pad=0):
    given = dict(pad=pad) if pad else {}
    n[name] = L.Pooling(n[bottom], pool=kind, kernel_size=kernel, stride=stride, **given)
    return name


def concat(n, name, branches):
    n[name] = L.Concat(*[n[b] for b in branches])
    return name


def block_a(n, p, bottom, pool_width):
    b1 = conv_bn(n, p + "/1x1", bottom, 64, 1)
    b5 = conv_bn(n, p + "/5x5", conv_bn(n, p + "/5x5_reduce", bottom, 48, 1), 64, 5, pad=2)
    b3 = conv_bn(n, p + "/3x3_reduce", bottom, 64, 1)
    b3 = conv_bn(n, p + "/3x3_a", b3, 96, 3, pad=1)
    b3 = conv_bn(n, p + "/3x3_b", b3, 96, 3, pad=1)
    bp = conv_bn(n, p + "/pool_proj", pool(n, p + "/pool", bottom, "AVE", 3, 1, 1), pool_width, 1)
    return concat(n, p + "/output", [b1, b5, b3, bp])


def reduction_a(n, p, bottom):
    b3 = conv_bn(n, p + "/3x3", bottom, 384, 3, stride=2)
    bd = conv_bn(n, p + "/3x3dbl_reduce", bottom, 64, 1)
    bd = conv_bn(n, p + "/3x3dbl_a", bd, 96, 3, pad=1)
    bd = conv_bn(n, p + "/3x3dbl_b", bd, 96, 3, stride=2)
    bp = pool(n, p + "/pool", bottom, "MAX", 3, 2)
    return concat(n, p + "/output", [b3, bd, bp])


def block_b(n, p, bottom, c):
    b1 = conv_bn(n, p + "/1x1", bottom, 192, 1)
    b7 = conv_bn(n, p + "/7x7_reduce", bottom, c, 1)
    b7 = conv_bn(n, p + "/1x7", b7, c, (1, 7), pad=(0, 3))
    b7 = conv_bn(n, p + "/7x1", b7, 192, (7, 1), pad=(3, 0))
    bd = conv_bn(n, p + "/7x7dbl_reduce", bottom, c, 1)
    for k, (num, kernel, pad) in enumerate([(c, (7, 1), (3, 0)), (c, (1, 7), (0, 3)),
                                            (c, (7, 1), (3, 0)), (192, (1, 7), (0, 3))]):
        bd = conv_bn(n, p + "/7x7dbl_%d" % k, bd, num, kernel, pad=pad)
    bp = conv_bn(n, p + "/pool_proj", pool(n, p + "/pool", bottom, "AVE", 3, 1, 1), 192, 1)
    return concat(n, p + "/output", [b1, b7, bd, bp])


def reduction_b(n, p, bottom):
    b3 = conv_bn(n, p + "/3x3", conv_bn(n, p + "/3x3_reduce", bottom, 192, 1), 320, 3, stride=2)
    b7 = conv_bn(n, p + "/7x7_reduce", bottom, 192, 1)
    b7 = conv_bn(n, p + "/1x7", b7, 192, (1, 7), pad=(0, 3))
    b7 = conv_bn(n, p + "/7x1", b7, 192, (7, 1), pad=(3, 0))
    b7 = conv_bn(n, p + "/7x7_3x3", b7, 192, 3, stride=2)
    bp = pool(n, p + "/pool", bottom, "MAX", 3, 2)
    return concat(n, p + "/output", [b3, b7, bp])


def block_c(n, p, bottom):
    b1 = conv_bn(n, p + "/1x1", bottom, 320, 1)
    b3 = conv_bn(n, p + "/3x3_reduce", bottom, 384, 1)
    b3a = conv_bn(n, p + "/1x3", b3, 384, (1, 3), pad=(0, 1))
    b3b = conv_bn(n, p + "/3x1", b3, 384, (3, 1), pad=(1, 0))
    bd = conv_bn(n, p + "/3x3dbl_reduce", bottom, 448, 1)
    bd = conv_bn(n, p + "/3x3dbl", bd, 384, 3, pad=1)
    bda = conv_bn(n, p + "/3x3dbl_1x3", bd, 384, (1, 3), pad=(0, 1))
    bdb = conv_bn(n, p + "/3x3dbl_3x1", bd, 384, (3, 1), pad=(1, 0))
    bp = conv_bn(n, p + "/pool_proj", pool(n, p + "/pool", bottom, "AVE", 3, 1, 1), 192, 1)
    return concat(n, p + "/output", [b1, b3a, b3b, bda, bdb, bp])


def inception_v3(batch=32):
    n = NetSpec()
    inputs(n, batch, 299)
    top = conv_bn(n, "conv1_3x3_s2", "data", 32, 3, stride=2)        # 149
    top = conv_bn(n, "conv2_3x3", top, 32, 3)                          # 147
    top = conv_bn(n, "conv3_3x3", top, 64, 3, pad=1)                   # 147
    top = pool(n, "pool1_3x3_s2", top, "MAX", 3, 2)                    # 73
    top = conv_bn(n, "conv4_1x1", top, 80, 1)                          # 73
    top = conv_bn(n, "conv5_3x3", top, 192, 3)                         # 71
    top = pool(n, "pool2_3x3_s2", top, "MAX", 3, 2)                    # 35
    for k, width in enumerate((32, 64, 64)):
        top = block_a(n, "mixed_%d" % k, top, width)                   # 35 x 35 x 288
    top = reduction_a(n, "mixed_3", top)                               # 17 x 17 x 768
    for k, c in enumerate((128, 160, 160, 192)):
        top = block_b(n, "mixed_%d" % (k + 4), top, c)                 # 17 x 17 x 768
    aux = pool(n, "aux/ave_pool", top, "AVE", 5, 3)                    # 5 x 5
    aux = conv_bn(n, "aux/conv", aux, 128, 1)
    aux = conv_bn(n, "aux/conv2", aux, 768, 5)                         # 1 x 1
    n["aux/classifier"] = L.InnerProduct(n[aux], param=LEARNING, num_output=1000,
                                         weight_filler=dict(type="xavier"))
    n["aux/loss"] = L.SoftmaxWithLoss(n["aux/classifier"], n.label, loss_weight=0.4)
    top = reduction_b(n, "mixed_8", top)                               # 8 x 8 x 1280
    for k in (9, 10):
        top = block_c(n, "mixed_%d" % k, top)                          # 8 x 8 x 2048
    top = pool(n, "pool3_8x8", top, "AVE", 8, 1)
    n["pool3_drop"] = L.Dropout(n[top], dropout_ratio=0.2, in_place=True)
    n.classifier = L.InnerProduct(n[top], param=LEARNING, num_output=1000,
                                  weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.classifier, n.label)
    net = n.to_proto()
    net.name = "Inception-V3"
    return net


if __name__ == "__main__":
    write_text_proto(vgg19_22k(), os.path.join(HERE, "vgg19_22k.prototxt"))
    write_text_proto(inception_v3(), os.path.join(HERE, "inception_v3.prototxt"))
