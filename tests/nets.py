"""Well-known Caffe nets written as prototxt text, with the blob shapes Caffe's rules give them.

The expected shapes are worked out here from Caffe's output-size rules, independently of the
code under test: convolution (in + 2p - k) / s + 1 rounded down, pooling rounded up.
"""


def _fmt(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) and value.isupper():
        return value                       # enum
    if isinstance(value, str):
        return '"%s"' % value
    return str(value)


def _block(name, fields):
    inner = []
    for key, value in fields.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, dict):
                inner.append(_block(key, v))
            else:
                inner.append("%s: %s" % (key, _fmt(v)))
    return "%s { %s }" % (name, " ".join(inner))


def layer(name, type_, bottom=(), top=(), **fields):
    text = ['name: "%s"' % name, 'type: "%s"' % type_]
    text += ['bottom: "%s"' % b for b in ([bottom] if isinstance(bottom, str) else bottom)]
    text += ['top: "%s"' % t for t in ([top] if isinstance(top, str) else top)]
    for key, value in fields.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            text.append(_block(key, v) if isinstance(v, dict) else "%s: %s" % (key, _fmt(v)))
    return "layer { %s }\n" % " ".join(text)


XAVIER = {"type": "xavier"}
GAUSS = {"type": "gaussian", "std": 0.01}
CONST = {"type": "constant", "value": 0.1}


def conv(name, bottom, num, k, s=1, p=0, group=1, top=None, filler=XAVIER):
    params = {"num_output": num, "kernel_size": k, "weight_filler": filler,
              "bias_filler": CONST}
    if s != 1:
        params["stride"] = s
    if p:
        params["pad"] = p
    if group != 1:
        params["group"] = group
    return layer(name, "Convolution", bottom, top or name,
                 param=[{"lr_mult": 1, "decay_mult": 1}, {"lr_mult": 2, "decay_mult": 0}],
                 convolution_param=params)


def relu(name, blob):
    return layer(name, "ReLU", blob, blob)


def pool(name, bottom, method, k, s, p=0, top=None):
    params = {"pool": method, "kernel_size": k, "stride": s}
    if p:
        params["pad"] = p
    return layer(name, "Pooling", bottom, top or name, pooling_param=params)


def lrn(name, bottom, top=None):
    return layer(name, "LRN", bottom, top or name,
                 lrn_param={"local_size": 5, "alpha": 0.0001, "beta": 0.75})


def fc(name, bottom, num, top=None, filler=XAVIER):
    return layer(name, "InnerProduct", bottom, top or name,
                 param=[{"lr_mult": 1}, {"lr_mult": 2}],
                 inner_product_param={"num_output": num, "weight_filler": filler,
                                      "bias_filler": CONST})


def input_layer(shapes, tops=("data", "label")):
    return layer("data", "Input", (), list(tops),
                 input_param={"shape": [{"dim": list(s)} for s in shapes]})


def loss_and_accuracy(bottom, label="label", name="loss", weight=None, accuracy=True):
    fields = {"loss_weight": weight} if weight is not None else {}
    text = layer(name, "SoftmaxWithLoss", [bottom, label], name, **fields)
    if accuracy:
        text += layer(name + "_accuracy", "Accuracy", [bottom, label], name + "_accuracy",
                      include={"phase": "TEST"})
    return text


def lenet(batch=4):
    text = 'name: "LeNet"\n' + input_layer([(batch, 1, 28, 28), (batch,)])
    text += conv("conv1", "data", 20, 5) + pool("pool1", "conv1", "MAX", 2, 2)
    text += conv("conv2", "pool1", 50, 5) + pool("pool2", "conv2", "MAX", 2, 2)
    text += fc("ip1", "pool2", 500) + relu("relu1", "ip1") + fc("ip2", "ip1", 10)
    text += loss_and_accuracy("ip2")
    shapes = {"data": (batch, 1, 28, 28), "conv1": (batch, 20, 24, 24),
              "pool1": (batch, 20, 12, 12), "conv2": (batch, 50, 8, 8),
              "pool2": (batch, 50, 4, 4), "ip1": (batch, 500), "ip2": (batch, 10), "loss": ()}
    params = {"conv1": [(20, 1, 5, 5), (20,)], "conv2": [(50, 20, 5, 5), (50,)],
              "ip1": [(500, 800), (500,)], "ip2": [(10, 500), (10,)]}
    return text, shapes, params


def cifar10_quick(batch=2):
    text = 'name: "CIFAR10_quick"\n' + input_layer([(batch, 3, 32, 32), (batch,)])
    text += conv("conv1", "data", 32, 5, p=2, filler=GAUSS) + pool("pool1", "conv1", "MAX", 3, 2)
    text += relu("relu1", "pool1")
    text += conv("conv2", "pool1", 32, 5, p=2) + relu("relu2", "conv2")
    text += pool("pool2", "conv2", "AVE", 3, 2)
    text += conv("conv3", "pool2", 64, 5, p=2) + relu("relu3", "conv3")
    text += pool("pool3", "conv3", "AVE", 3, 2)
    text += fc("ip1", "pool3", 64) + fc("ip2", "ip1", 10) + loss_and_accuracy("ip2")
    # pooling rounds up: (32 - 3) / 2 -> 14.5 -> 15, + 1 = 16
    shapes = {"conv1": (batch, 32, 32, 32), "pool1": (batch, 32, 16, 16),
              "conv2": (batch, 32, 16, 16), "pool2": (batch, 32, 8, 8),
              "conv3": (batch, 64, 8, 8), "pool3": (batch, 64, 4, 4), "ip1": (batch, 64),
              "ip2": (batch, 10)}
    params = {"conv1": [(32, 3, 5, 5), (32,)], "conv3": [(64, 32, 5, 5), (64,)],
              "ip1": [(64, 1024), (64,)]}
    return text, shapes, params


def caffenet(batch=1):
    """CaffeNet/AlexNet: LRN, grouped convolutions, dropout, 227x227 input."""
    text = 'name: "CaffeNet"\n' + input_layer([(batch, 3, 227, 227), (batch,)])
    text += conv("conv1", "data", 96, 11, s=4, filler=GAUSS) + relu("relu1", "conv1")
    text += pool("pool1", "conv1", "MAX", 3, 2) + lrn("norm1", "pool1")
    text += conv("conv2", "norm1", 256, 5, p=2, group=2) + relu("relu2", "conv2")
    text += pool("pool2", "conv2", "MAX", 3, 2) + lrn("norm2", "pool2")
    text += conv("conv3", "norm2", 384, 3, p=1) + relu("relu3", "conv3")
    text += conv("conv4", "conv3", 384, 3, p=1, group=2) + relu("relu4", "conv4")
    text += conv("conv5", "conv4", 256, 3, p=1, group=2) + relu("relu5", "conv5")
    text += pool("pool5", "conv5", "MAX", 3, 2)
    text += fc("fc6", "pool5", 4096, filler=GAUSS) + relu("relu6", "fc6")
    text += layer("drop6", "Dropout", "fc6", "fc6", dropout_param={"dropout_ratio": 0.5})
    text += fc("fc7", "fc6", 4096, filler=GAUSS) + relu("relu7", "fc7")
    text += layer("drop7", "Dropout", "fc7", "fc7", dropout_param={"dropout_ratio": 0.5})
    text += fc("fc8", "fc7", 1000, filler=GAUSS) + loss_and_accuracy("fc8")
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
    return text, shapes, params


# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj) of each GoogLeNet inception module
INCEPTION = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
             "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
             "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
             "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
             "5b": (384, 192, 384, 48, 128, 128)}


def _inception(tag, bottom):
    n1, r3, n3, r5, n5, pp = INCEPTION[tag]
    p = "inception_%s/" % tag
    text = conv(p + "1x1", bottom, n1, 1) + relu(p + "relu_1x1", p + "1x1")
    text += conv(p + "3x3_reduce", bottom, r3, 1) + relu(p + "relu_3x3_reduce", p + "3x3_reduce")
    text += conv(p + "3x3", p + "3x3_reduce", n3, 3, p=1) + relu(p + "relu_3x3", p + "3x3")
    text += conv(p + "5x5_reduce", bottom, r5, 1) + relu(p + "relu_5x5_reduce", p + "5x5_reduce")
    text += conv(p + "5x5", p + "5x5_reduce", n5, 5, p=2) + relu(p + "relu_5x5", p + "5x5")
    text += pool(p + "pool", bottom, "MAX", 3, 1, p=1)
    text += conv(p + "pool_proj", p + "pool", pp, 1) + relu(p + "relu_pool_proj", p + "pool_proj")
    text += layer(p + "output", "Concat",
                  [p + "1x1", p + "3x3", p + "5x5", p + "pool_proj"], p + "output")
    return text, n1 + n3 + n5 + pp


def _aux_loss(tag, bottom, batch):
    p = "loss%s/" % tag
    text = pool(p + "ave_pool", bottom, "AVE", 5, 3)
    text += conv(p + "conv", p + "ave_pool", 128, 1) + relu(p + "relu_conv", p + "conv")
    text += fc(p + "fc", p + "conv", 1024) + relu(p + "relu_fc", p + "fc")
    text += layer(p + "drop_fc", "Dropout", p + "fc", p + "fc",
                  dropout_param={"dropout_ratio": 0.7})
    text += fc(p + "classifier", p + "fc", 1000)
    text += loss_and_accuracy(p + "classifier", name=p + "loss", weight=0.3, accuracy=False)
    shapes = {p + "ave_pool": (batch, None, 4, 4), p + "conv": (batch, 128, 4, 4),
              p + "fc": (batch, 1024), p + "classifier": (batch, 1000)}
    return text, shapes


def googlenet(batch=1):
    """GoogLeNet (Inception v1) with both auxiliary losses, 224x224 input."""
    text = 'name: "GoogleNet"\n' + input_layer([(batch, 3, 224, 224), (batch,)])
    text += conv("conv1/7x7_s2", "data", 64, 7, s=2, p=3) + relu("conv1/relu", "conv1/7x7_s2")
    text += pool("pool1/3x3_s2", "conv1/7x7_s2", "MAX", 3, 2) + lrn("pool1/norm1", "pool1/3x3_s2")
    text += conv("conv2/3x3_reduce", "pool1/norm1", 64, 1)
    text += relu("conv2/relu_3x3_reduce", "conv2/3x3_reduce")
    text += conv("conv2/3x3", "conv2/3x3_reduce", 192, 3, p=1) + relu("conv2/relu", "conv2/3x3")
    text += lrn("conv2/norm2", "conv2/3x3") + pool("pool2/3x3_s2", "conv2/norm2", "MAX", 3, 2)
    shapes = {"conv1/7x7_s2": (batch, 64, 112, 112), "pool1/3x3_s2": (batch, 64, 56, 56),
              "conv2/3x3": (batch, 192, 56, 56), "pool2/3x3_s2": (batch, 192, 28, 28)}
    bottom, size = "pool2/3x3_s2", 28
    for tag in ["3a", "3b", "pool3", "4a", "4b", "4c", "4d", "4e", "pool4", "5a", "5b"]:
        if tag.startswith("pool"):
            name = "%s/3x3_s2" % tag
            text += pool(name, bottom, "MAX", 3, 2)
            size = -(-(size - 3) // 2) + 1
            bottom = name
            shapes[name] = (batch, None, size, size)
            continue
        block, channels = _inception(tag, bottom)
        text += block
        bottom = "inception_%s/output" % tag
        shapes[bottom] = (batch, channels, size, size)
        if tag in ("4a", "4d"):
            aux, aux_shapes = _aux_loss("1" if tag == "4a" else "2", bottom, batch)
            text += aux
            shapes.update(aux_shapes)
    text += pool("pool5/7x7_s1", bottom, "AVE", 7, 1)
    text += layer("pool5/drop_7x7_s1", "Dropout", "pool5/7x7_s1", "pool5/7x7_s1",
                  dropout_param={"dropout_ratio": 0.4})
    text += fc("loss3/classifier", "pool5/7x7_s1", 1000)
    text += loss_and_accuracy("loss3/classifier", name="loss3/loss3", weight=1)
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
    return text, shapes, params


def vgg_small(batch=2):
    """VGG-style: stacks of 3x3 pad-1 convolutions between 2x2 max pools."""
    text = 'name: "VGG_small"\n' + input_layer([(batch, 3, 32, 32), (batch,)])
    bottom, size = "data", 32
    shapes = {}
    for stage, (num, reps) in enumerate([(16, 2), (32, 2), (64, 3)], start=1):
        for r in range(1, reps + 1):
            name = "conv%d_%d" % (stage, r)
            text += conv(name, bottom, num, 3, p=1) + relu("relu%d_%d" % (stage, r), name)
            bottom = name
            shapes[name] = (batch, num, size, size)
        name = "pool%d" % stage
        text += pool(name, bottom, "MAX", 2, 2)
        size //= 2
        shapes[name] = (batch, num, size, size)
        bottom = name
    text += fc("fc6", bottom, 64) + relu("relu6", "fc6")
    text += layer("drop6", "Dropout", "fc6", "fc6", dropout_param={"dropout_ratio": 0.5})
    text += fc("fc7", "fc6", 10) + loss_and_accuracy("fc7")
    shapes.update({"fc6": (batch, 64), "fc7": (batch, 10)})
    params = {"conv3_3": [(64, 64, 3, 3), (64,)], "fc6": [(64, 64 * 4 * 4), (64,)]}
    return text, shapes, params


def _bn_scale(name, blob):
    return (layer("bn_" + name, "BatchNorm", blob, blob)
            + layer("scale_" + name, "Scale", blob, blob, scale_param={"bias_term": True}))


def _conv_nobias(name, bottom, num, k, s=1, p=0):
    params = {"num_output": num, "kernel_size": k, "bias_term": False,
              "weight_filler": {"type": "msra"}}
    if s != 1:
        params["stride"] = s
    if p:
        params["pad"] = p
    return layer(name, "Convolution", bottom, name, convolution_param=params)


def _bottleneck(tag, bottom, inner, outer, stride, project):
    text = ""
    p = "res" + tag
    if project:
        text += _conv_nobias(p + "_branch1", bottom, outer, 1, s=stride)
        text += _bn_scale(p + "_branch1", p + "_branch1")
        shortcut = p + "_branch1"
    else:
        shortcut = bottom
    text += _conv_nobias(p + "_branch2a", bottom, inner, 1, s=stride)
    text += _bn_scale(p + "_branch2a", p + "_branch2a") + relu(p + "_branch2a_relu",
                                                               p + "_branch2a")
    text += _conv_nobias(p + "_branch2b", p + "_branch2a", inner, 3, p=1)
    text += _bn_scale(p + "_branch2b", p + "_branch2b") + relu(p + "_branch2b_relu",
                                                               p + "_branch2b")
    text += _conv_nobias(p + "_branch2c", p + "_branch2b", outer, 1)
    text += _bn_scale(p + "_branch2c", p + "_branch2c")
    text += layer(p, "Eltwise", [shortcut, p + "_branch2c"], p)
    text += relu(p + "_relu", p)
    return text


def resnet_small(batch=2):
    """ResNet-style: BatchNorm + Scale after bias-free convolutions, Eltwise SUM shortcuts."""
    text = 'name: "ResNet_small"\n' + input_layer([(batch, 3, 64, 64), (batch,)])
    text += _conv_nobias("conv1", "data", 16, 7, s=2, p=3) + _bn_scale("conv1", "conv1")
    text += relu("conv1_relu", "conv1") + pool("pool1", "conv1", "MAX", 3, 2)
    text += _bottleneck("2a", "pool1", 8, 32, 1, True)
    text += _bottleneck("2b", "res2a", 8, 32, 1, False)
    text += _bottleneck("3a", "res2b", 16, 64, 2, True)
    text += layer("pool5", "Pooling", "res3a", "pool5",
                  pooling_param={"pool": "AVE", "global_pooling": True})
    text += fc("fc10", "pool5", 10) + loss_and_accuracy("fc10")
    # conv1: (64 + 6 - 7) / 2 + 1 = 32; pool1: ceil((32 - 3) / 2) + 1 = 16; res3a: stride 2 -> 8
    shapes = {"conv1": (batch, 16, 32, 32), "pool1": (batch, 16, 16, 16),
              "res2a_branch1": (batch, 32, 16, 16), "res2a": (batch, 32, 16, 16),
              "res2b": (batch, 32, 16, 16), "res3a_branch2a": (batch, 16, 8, 8),
              "res3a": (batch, 64, 8, 8), "pool5": (batch, 64, 1, 1), "fc10": (batch, 10)}
    params = {"conv1": [(16, 3, 7, 7)], "bn_conv1": [(16,), (16,), (1,)],
              "scale_conv1": [(16,), (16,)], "res2a_branch2c": [(32, 8, 1, 1)]}
    return text, shapes, params


ALL = {"lenet": lenet, "cifar10_quick": cifar10_quick, "caffenet": caffenet,
       "googlenet": googlenet, "vgg_small": vgg_small, "resnet_small": resnet_small}
