"""Well-known Caffe nets built with NetSpec, as prototxt text, with the blob shapes Caffe's
rules give them.

The expected shapes are worked out here from Caffe's output-size rules, independently of the
code under test: convolution (in + 2p - k) / s + 1 rounded down, pooling rounded up.
"""
from google.protobuf import text_format

from poseidon_caffe.net_spec import L, NetSpec

XAVIER = {"type": "xavier"}
GAUSS = {"type": "gaussian", "std": 0.01}
CONST = {"type": "constant", "value": 0.1}


def _text(name, n):
    net = n.to_proto()
    net.name = name
    return text_format.MessageToString(net)


def _geometry(s, p, group=1):
    """Stride, pad and group, given only where they differ from Caffe's defaults."""
    return {key: value for key, value, default in (("stride", s, 1), ("pad", p, 0),
                                                   ("group", group, 1)) if value != default}


def conv(n, name, bottom, num, k, s=1, p=0, group=1, filler=XAVIER):
    n[name] = L.Convolution(n[bottom], num_output=num, kernel_size=k, weight_filler=filler,
                            bias_filler=CONST, **_geometry(s, p, group),
                            param=[{"lr_mult": 1, "decay_mult": 1},
                                   {"lr_mult": 2, "decay_mult": 0}])


def relu(n, name, blob):
    n[name] = L.ReLU(n[blob], in_place=True)


def pool(n, name, bottom, method, k, s, p=0):
    given = {"pad": p} if p else {}
    n[name] = L.Pooling(n[bottom], pool=method, kernel_size=k, stride=s, **given)


def lrn(n, name, bottom):
    n[name] = L.LRN(n[bottom], local_size=5, alpha=0.0001, beta=0.75)


def fc(n, name, bottom, num, filler=XAVIER):
    n[name] = L.InnerProduct(n[bottom], num_output=num, weight_filler=filler, bias_filler=CONST,
                             param=[{"lr_mult": 1}, {"lr_mult": 2}])


def dropout(n, name, blob, ratio):
    n[name] = L.Dropout(n[blob], dropout_ratio=ratio, in_place=True)


def input_layer(n, shapes):
    n.data, n.label = L.Input(ntop=2, shape=[{"dim": list(s)} for s in shapes])


def loss_and_accuracy(n, bottom, name="loss", weight=None, accuracy=True):
    given = {"loss_weight": weight} if weight is not None else {}
    n[name] = L.SoftmaxWithLoss(n[bottom], n.label, **given)
    if accuracy:
        n[name + "_accuracy"] = L.Accuracy(n[bottom], n.label, include={"phase": "TEST"})


def lenet(batch=4):
    n = NetSpec()
    input_layer(n, [(batch, 1, 28, 28), (batch,)])
    conv(n, "conv1", "data", 20, 5)
    pool(n, "pool1", "conv1", "MAX", 2, 2)
    conv(n, "conv2", "pool1", 50, 5)
    pool(n, "pool2", "conv2", "MAX", 2, 2)
    fc(n, "ip1", "pool2", 500)
    relu(n, "relu1", "ip1")
    fc(n, "ip2", "ip1", 10)
    loss_and_accuracy(n, "ip2")
    shapes = {"data": (batch, 1, 28, 28), "conv1": (batch, 20, 24, 24),
              "pool1": (batch, 20, 12, 12), "conv2": (batch, 50, 8, 8),
              "pool2": (batch, 50, 4, 4), "ip1": (batch, 500), "ip2": (batch, 10), "loss": ()}
    params = {"conv1": [(20, 1, 5, 5), (20,)], "conv2": [(50, 20, 5, 5), (50,)],
              "ip1": [(500, 800), (500,)], "ip2": [(10, 500), (10,)]}
    return _text("LeNet", n), shapes, params


def cifar10_quick(batch=2):
    n = NetSpec()
    input_layer(n, [(batch, 3, 32, 32), (batch,)])
    conv(n, "conv1", "data", 32, 5, p=2, filler=GAUSS)
    pool(n, "pool1", "conv1", "MAX", 3, 2)
    relu(n, "relu1", "pool1")
    conv(n, "conv2", "pool1", 32, 5, p=2)
    relu(n, "relu2", "conv2")
    pool(n, "pool2", "conv2", "AVE", 3, 2)
    conv(n, "conv3", "pool2", 64, 5, p=2)
    relu(n, "relu3", "conv3")
    pool(n, "pool3", "conv3", "AVE", 3, 2)
    fc(n, "ip1", "pool3", 64)
    fc(n, "ip2", "ip1", 10)
    loss_and_accuracy(n, "ip2")
    # pooling rounds up: (32 - 3) / 2 -> 14.5 -> 15, + 1 = 16
    shapes = {"conv1": (batch, 32, 32, 32), "pool1": (batch, 32, 16, 16),
              "conv2": (batch, 32, 16, 16), "pool2": (batch, 32, 8, 8),
              "conv3": (batch, 64, 8, 8), "pool3": (batch, 64, 4, 4), "ip1": (batch, 64),
              "ip2": (batch, 10)}
    params = {"conv1": [(32, 3, 5, 5), (32,)], "conv3": [(64, 32, 5, 5), (64,)],
              "ip1": [(64, 1024), (64,)]}
    return _text("CIFAR10_quick", n), shapes, params


def caffenet(batch=1):
    """CaffeNet/AlexNet: LRN, grouped convolutions, dropout, 227x227 input."""
    n = NetSpec()
    input_layer(n, [(batch, 3, 227, 227), (batch,)])
    conv(n, "conv1", "data", 96, 11, s=4, filler=GAUSS)
    relu(n, "relu1", "conv1")
    pool(n, "pool1", "conv1", "MAX", 3, 2)
    lrn(n, "norm1", "pool1")
    conv(n, "conv2", "norm1", 256, 5, p=2, group=2)
    relu(n, "relu2", "conv2")
    pool(n, "pool2", "conv2", "MAX", 3, 2)
    lrn(n, "norm2", "pool2")
    conv(n, "conv3", "norm2", 384, 3, p=1)
    relu(n, "relu3", "conv3")
    conv(n, "conv4", "conv3", 384, 3, p=1, group=2)
    relu(n, "relu4", "conv4")
    conv(n, "conv5", "conv4", 256, 3, p=1, group=2)
    relu(n, "relu5", "conv5")
    pool(n, "pool5", "conv5", "MAX", 3, 2)
    fc(n, "fc6", "pool5", 4096, filler=GAUSS)
    relu(n, "relu6", "fc6")
    dropout(n, "drop6", "fc6", 0.5)
    fc(n, "fc7", "fc6", 4096, filler=GAUSS)
    relu(n, "relu7", "fc7")
    dropout(n, "drop7", "fc7", 0.5)
    fc(n, "fc8", "fc7", 1000, filler=GAUSS)
    loss_and_accuracy(n, "fc8")
    # conv1: (227 - 11) / 4 + 1 = 55; pool1: ceil((55 - 3) / 2) + 1 = 27; pool2: 13; pool5: 6
    shapes = {"conv1": (batch, 96, 55, 55), "pool1": (batch, 96, 27, 27),
              "norm1": (batch, 96, 27, 27), "conv2": (batch, 256, 27, 27),
              "pool2": (batch, 256, 13, 13), "conv3": (batch, 384, 13, 13),
              "conv4": (batch, 384, 13, 13), "conv5": (batch, 256, 13, 13),
              "pool5": (batch, 256, 6, 6), "fc6": (batch, 4096), "fc7": (batch, 4096),
              "fc8": (batch, 1000)}
    params = {"conv1": [(96, 3, 11, 11), (96,)], "conv2": [(256, 48, 5, 5), (256,)],
              "conv4": [(384, 192, 3, 3), (384,)], "conv5": [(256, 192, 3, 3), (256,)],
              "fc6": [(4096, 9216), (4096,)], "fc8": [(1000, 4096), (1000,)]}
    return _text("CaffeNet", n), shapes, params


# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj) of each GoogLeNet inception module
INCEPTION = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
             "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
             "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
             "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
             "5b": (384, 192, 384, 48, 128, 128)}


def _inception(n, tag, bottom):
    """Adds module ``tag`` on ``bottom``; returns its output's name and channel count."""
    n1, r3, n3, r5, n5, pp = INCEPTION[tag]
    p = "inception_%s/" % tag
    conv(n, p + "1x1", bottom, n1, 1)
    relu(n, p + "relu_1x1", p + "1x1")
    conv(n, p + "3x3_reduce", bottom, r3, 1)
    relu(n, p + "relu_3x3_reduce", p + "3x3_reduce")
    conv(n, p + "3x3", p + "3x3_reduce", n3, 3, p=1)
    relu(n, p + "relu_3x3", p + "3x3")
    conv(n, p + "5x5_reduce", bottom, r5, 1)
    relu(n, p + "relu_5x5_reduce", p + "5x5_reduce")
    conv(n, p + "5x5", p + "5x5_reduce", n5, 5, p=2)
    relu(n, p + "relu_5x5", p + "5x5")
    pool(n, p + "pool", bottom, "MAX", 3, 1, p=1)
    conv(n, p + "pool_proj", p + "pool", pp, 1)
    relu(n, p + "relu_pool_proj", p + "pool_proj")
    n[p + "output"] = L.Concat(*[n[p + b] for b in ("1x1", "3x3", "5x5", "pool_proj")])
    return p + "output", n1 + n3 + n5 + pp


def _aux_loss(n, tag, bottom, batch):
    p = "loss%s/" % tag
    pool(n, p + "ave_pool", bottom, "AVE", 5, 3)
    conv(n, p + "conv", p + "ave_pool", 128, 1)
    relu(n, p + "relu_conv", p + "conv")
    fc(n, p + "fc", p + "conv", 1024)
    relu(n, p + "relu_fc", p + "fc")
    dropout(n, p + "drop_fc", p + "fc", 0.7)
    fc(n, p + "classifier", p + "fc", 1000)
    loss_and_accuracy(n, p + "classifier", name=p + "loss", weight=0.3, accuracy=False)
    return {p + "ave_pool": (batch, None, 4, 4), p + "conv": (batch, 128, 4, 4),
            p + "fc": (batch, 1024), p + "classifier": (batch, 1000)}


def googlenet(batch=1):
    """GoogLeNet (Inception v1) with both auxiliary losses, 224x224 input."""
    n = NetSpec()
    input_layer(n, [(batch, 3, 224, 224), (batch,)])
    conv(n, "conv1/7x7_s2", "data", 64, 7, s=2, p=3)
    relu(n, "conv1/relu", "conv1/7x7_s2")
    pool(n, "pool1/3x3_s2", "conv1/7x7_s2", "MAX", 3, 2)
    lrn(n, "pool1/norm1", "pool1/3x3_s2")
    conv(n, "conv2/3x3_reduce", "pool1/norm1", 64, 1)
    relu(n, "conv2/relu_3x3_reduce", "conv2/3x3_reduce")
    conv(n, "conv2/3x3", "conv2/3x3_reduce", 192, 3, p=1)
    relu(n, "conv2/relu", "conv2/3x3")
    lrn(n, "conv2/norm2", "conv2/3x3")
    pool(n, "pool2/3x3_s2", "conv2/norm2", "MAX", 3, 2)
    shapes = {"conv1/7x7_s2": (batch, 64, 112, 112), "pool1/3x3_s2": (batch, 64, 56, 56),
              "conv2/3x3": (batch, 192, 56, 56), "pool2/3x3_s2": (batch, 192, 28, 28)}
    bottom, size = "pool2/3x3_s2", 28
    for tag in ["3a", "3b", "pool3", "4a", "4b", "4c", "4d", "4e", "pool4", "5a", "5b"]:
        if tag.startswith("pool"):
            name = "%s/3x3_s2" % tag
            pool(n, name, bottom, "MAX", 3, 2)
            size = -(-(size - 3) // 2) + 1
            bottom = name
            shapes[name] = (batch, None, size, size)
            continue
        bottom, channels = _inception(n, tag, bottom)
        shapes[bottom] = (batch, channels, size, size)
        if tag in ("4a", "4d"):
            shapes.update(_aux_loss(n, "1" if tag == "4a" else "2", bottom, batch))
    pool(n, "pool5/7x7_s1", bottom, "AVE", 7, 1)
    dropout(n, "pool5/drop_7x7_s1", "pool5/7x7_s1", 0.4)
    fc(n, "loss3/classifier", "pool5/7x7_s1", 1000)
    loss_and_accuracy(n, "loss3/classifier", name="loss3/loss3", weight=1)
    shapes.update({"inception_3a/output": (batch, 256, 28, 28),
                   "inception_3b/output": (batch, 480, 28, 28),
                   "pool3/3x3_s2": (batch, 480, 14, 14),
                   "inception_4a/output": (batch, 512, 14, 14),
                   "inception_4d/output": (batch, 528, 14, 14),
                   "inception_4e/output": (batch, 832, 14, 14),
                   "pool4/3x3_s2": (batch, 832, 7, 7),
                   "inception_5b/output": (batch, 1024, 7, 7),
                   "pool5/7x7_s1": (batch, 1024, 1, 1), "loss3/classifier": (batch, 1000)})
    params = {"inception_3a/5x5": [(32, 16, 5, 5), (32,)],
              "loss1/fc": [(1024, 2048), (1024,)], "loss3/classifier": [(1000, 1024), (1000,)]}
    return _text("GoogleNet", n), shapes, params


def vgg_small(batch=2):
    """VGG-style: stacks of 3x3 pad-1 convolutions between 2x2 max pools."""
    n = NetSpec()
    input_layer(n, [(batch, 3, 32, 32), (batch,)])
    bottom, size = "data", 32
    shapes = {}
    for stage, (num, reps) in enumerate([(16, 2), (32, 2), (64, 3)], start=1):
        for r in range(1, reps + 1):
            name = "conv%d_%d" % (stage, r)
            conv(n, name, bottom, num, 3, p=1)
            relu(n, "relu%d_%d" % (stage, r), name)
            bottom = name
            shapes[name] = (batch, num, size, size)
        name = "pool%d" % stage
        pool(n, name, bottom, "MAX", 2, 2)
        size //= 2
        shapes[name] = (batch, num, size, size)
        bottom = name
    fc(n, "fc6", bottom, 64)
    relu(n, "relu6", "fc6")
    dropout(n, "drop6", "fc6", 0.5)
    fc(n, "fc7", "fc6", 10)
    loss_and_accuracy(n, "fc7")
    shapes.update({"fc6": (batch, 64), "fc7": (batch, 10)})
    params = {"conv3_3": [(64, 64, 3, 3), (64,)], "fc6": [(64, 64 * 4 * 4), (64,)]}
    return _text("VGG_small", n), shapes, params


def _bn_scale(n, name, blob):
    n["bn_" + name] = L.BatchNorm(n[blob], in_place=True)
    n["scale_" + name] = L.Scale(n[blob], bias_term=True, in_place=True)


def _conv_nobias(n, name, bottom, num, k, s=1, p=0):
    n[name] = L.Convolution(n[bottom], num_output=num, kernel_size=k, bias_term=False,
                            weight_filler={"type": "msra"}, **_geometry(s, p))


def _bottleneck(n, tag, bottom, inner, outer, stride, project):
    p = "res" + tag
    if project:
        _conv_nobias(n, p + "_branch1", bottom, outer, 1, s=stride)
        _bn_scale(n, p + "_branch1", p + "_branch1")
        shortcut = p + "_branch1"
    else:
        shortcut = bottom
    _conv_nobias(n, p + "_branch2a", bottom, inner, 1, s=stride)
    _bn_scale(n, p + "_branch2a", p + "_branch2a")
    relu(n, p + "_branch2a_relu", p + "_branch2a")
    _conv_nobias(n, p + "_branch2b", p + "_branch2a", inner, 3, p=1)
    _bn_scale(n, p + "_branch2b", p + "_branch2b")
    relu(n, p + "_branch2b_relu", p + "_branch2b")
    _conv_nobias(n, p + "_branch2c", p + "_branch2b", outer, 1)
    _bn_scale(n, p + "_branch2c", p + "_branch2c")
    n[p] = L.Eltwise(n[shortcut], n[p + "_branch2c"])
    relu(n, p + "_relu", p)


def resnet_small(batch=2):
    """ResNet-style: BatchNorm + Scale after bias-free convolutions, Eltwise SUM shortcuts."""
    n = NetSpec()
    input_layer(n, [(batch, 3, 64, 64), (batch,)])
    _conv_nobias(n, "conv1", "data", 16, 7, s=2, p=3)
    _bn_scale(n, "conv1", "conv1")
    relu(n, "conv1_relu", "conv1")
    pool(n, "pool1", "conv1", "MAX", 3, 2)
    _bottleneck(n, "2a", "pool1", 8, 32, 1, True)
    _bottleneck(n, "2b", "res2a", 8, 32, 1, False)
    _bottleneck(n, "3a", "res2b", 16, 64, 2, True)
    n.pool5 = L.Pooling(n.res3a, pool="AVE", global_pooling=True)
    fc(n, "fc10", "pool5", 10)
    loss_and_accuracy(n, "fc10")
    # conv1: (64 + 6 - 7) / 2 + 1 = 32; pool1: ceil((32 - 3) / 2) + 1 = 16; res3a: stride 2 -> 8
    shapes = {"conv1": (batch, 16, 32, 32), "pool1": (batch, 16, 16, 16),
              "res2a_branch1": (batch, 32, 16, 16), "res2a": (batch, 32, 16, 16),
              "res2b": (batch, 32, 16, 16), "res3a_branch2a": (batch, 16, 8, 8),
              "res3a": (batch, 64, 8, 8), "pool5": (batch, 64, 1, 1), "fc10": (batch, 10)}
    params = {"conv1": [(16, 3, 7, 7)], "bn_conv1": [(16,), (16,), (1,)],
              "scale_conv1": [(16,), (16,)], "res2a_branch2c": [(32, 8, 1, 1)]}
    return _text("ResNet_small", n), shapes, params


ALL = {"lenet": lenet, "cifar10_quick": cifar10_quick, "caffenet": caffenet,
       "googlenet": googlenet, "vgg_small": vgg_small, "resnet_small": resnet_small}
