"""Writes train_val.prototxt (GoogLeNet, Szegedy et al. 2014, with Caffe's bvlc_googlenet layer
names and its two auxiliary classifiers) reading ImageNet LMDBs made by convert_imageset.
Run: python examples/googlenet/make_prototxt.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from poseidon_caffe.io import write_text_proto  # noqa: E402
from poseidon_caffe.net_spec import L, NetSpec  # noqa: E402

# weights at the base rate with weight decay, biases at twice the rate without
LEARNING = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]


def weight_filler(std):
    return dict(type="gaussian", std=std) if std else dict(type="xavier")


def conv(n, name, bottom, num, kernel, stride=1, pad=0, std=None):
    """A convolution and its ReLU (in place, named <name>_relu)."""
    n[name] = L.Convolution(n[bottom], param=LEARNING, num_output=num, kernel_size=kernel,
                            stride=stride, pad=pad, weight_filler=weight_filler(std),
                            bias_filler=dict(type="constant", value=0.2))
    n[name + "_relu"] = L.ReLU(n[name], in_place=True)


def pool(n, name, bottom, kind, kernel, stride, pad=0):
    n[name] = L.Pooling(n[bottom], pool=kind, kernel_size=kernel, stride=stride, pad=pad)


def lrn(n, name, bottom):
    n[name] = L.LRN(n[bottom], local_size=5, alpha=0.0001, beta=0.75)


def fc(n, name, bottom, num, std=None):
    n[name] = L.InnerProduct(n[bottom], param=LEARNING, num_output=num,
                             weight_filler=weight_filler(std),
                             bias_filler=dict(type="constant", value=0))


def inception(n, name, bottom, n1, n3r, n3, n5r, n5, npool):
    """One inception module on ``bottom``; returns the name of its output."""
    p = name + "/"
    conv(n, p + "1x1", bottom, n1, 1)
    conv(n, p + "3x3_reduce", bottom, n3r, 1)
    conv(n, p + "3x3", p + "3x3_reduce", n3, 3, pad=1)
    conv(n, p + "5x5_reduce", bottom, n5r, 1)
    conv(n, p + "5x5", p + "5x5_reduce", n5, 5, pad=2)
    pool(n, p + "pool", bottom, "MAX", 3, 1, 1)
    conv(n, p + "pool_proj", p + "pool", npool, 1)
    n[p + "output"] = L.Concat(*[n[p + branch] for branch in ("1x1", "3x3", "5x5", "pool_proj")])
    return p + "output"


def loss(n, prefix, bottom, weight):
    """The loss of a classifier and, in the TEST phase, its top-1 and top-5 accuracy."""
    n[prefix + "/loss"] = L.SoftmaxWithLoss(n[bottom], n.label, loss_weight=weight)
    n[prefix + "/top-1"] = L.Accuracy(n[bottom], n.label, include=dict(phase="TEST"))
    n[prefix + "/top-5"] = L.Accuracy(n[bottom], n.label, include=dict(phase="TEST"), top_k=5)


def auxiliary(n, prefix, bottom):
    pool(n, prefix + "/ave_pool", bottom, "AVE", 5, 3)
    conv(n, prefix + "/conv", prefix + "/ave_pool", 128, 1)
    fc(n, prefix + "/fc", prefix + "/conv", 1024)
    n[prefix + "/relu_fc"] = L.ReLU(n[prefix + "/fc"], in_place=True)
    n[prefix + "/drop_fc"] = L.Dropout(n[prefix + "/fc"], dropout_ratio=0.7, in_place=True)
    fc(n, prefix + "/classifier", prefix + "/fc", 1000)
    loss(n, prefix, prefix + "/classifier", 0.3)


def data(n, phase, source, batch, mirror):
    n.data, n.label = L.Data(ntop=2, include=dict(phase=phase),
                             transform_param=dict(mirror=mirror, crop_size=224,
                                                  mean_value=[104, 117, 123]),
                             source=source, batch_size=batch, backend="LMDB")


def googlenet():
    """The NetParameter of train_val.prototxt."""
    n = NetSpec()
    data(n, "TRAIN", "examples/imagenet/ilsvrc12_train_lmdb", 32, True)
    conv(n, "conv1/7x7_s2", "data", 64, 7, stride=2, pad=3)
    pool(n, "pool1/3x3_s2", "conv1/7x7_s2", "MAX", 3, 2)
    lrn(n, "pool1/norm1", "pool1/3x3_s2")
    conv(n, "conv2/3x3_reduce", "pool1/norm1", 64, 1)
    conv(n, "conv2/3x3", "conv2/3x3_reduce", 192, 3, pad=1)
    lrn(n, "conv2/norm2", "conv2/3x3")
    pool(n, "pool2/3x3_s2", "conv2/norm2", "MAX", 3, 2)
    top = "pool2/3x3_s2"
    modules = [("inception_3a", 64, 96, 128, 16, 32, 32), ("inception_3b", 128, 128, 192, 32, 96, 64),
               "pool3", ("inception_4a", 192, 96, 208, 16, 48, 64), "loss1",
               ("inception_4b", 160, 112, 224, 24, 64, 64), ("inception_4c", 128, 128, 256, 24, 64, 64),
               ("inception_4d", 112, 144, 288, 32, 64, 64), "loss2",
               ("inception_4e", 256, 160, 320, 32, 128, 128), "pool4",
               ("inception_5a", 256, 160, 320, 32, 128, 128), ("inception_5b", 384, 192, 384, 48, 128, 128)]
    for m in modules:
        if m in ("pool3", "pool4"):
            pool(n, m + "/3x3_s2", top, "MAX", 3, 2)
            top = m + "/3x3_s2"
        elif m in ("loss1", "loss2"):
            auxiliary(n, m, top)
        else:
            top = inception(n, m[0], top, *m[1:])
    pool(n, "pool5/7x7_s1", top, "AVE", 7, 1)
    n["pool5/drop_7x7_s1"] = L.Dropout(n["pool5/7x7_s1"], dropout_ratio=0.4, in_place=True)
    fc(n, "loss3/classifier", "pool5/7x7_s1", 1000)
    loss(n, "loss3", "loss3/classifier", 1.0)
    net = n.to_proto()
    net.name = "GoogleNet"
    # a NetSpec names each top once: the TEST phase's Data layer, with the same tops, is
    # built on its own and goes after the TRAIN one
    test = NetSpec()
    data(test, "TEST", "examples/imagenet/ilsvrc12_val_lmdb", 50, False)
    net.layer.insert(1, test.to_proto().layer[0])
    return net


if __name__ == "__main__":
    write_text_proto(googlenet(), os.path.join(HERE, "train_val.prototxt"))
