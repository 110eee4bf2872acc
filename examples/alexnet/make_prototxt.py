"""Writes train_val.prototxt (AlexNet, as in Krizhevsky et al. 2012 with Caffe's layer names)
reading ImageNet LMDBs made by convert_imageset. Run: python examples/alexnet/make_prototxt.py"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from poseidon_caffe.io import write_text_proto  # noqa: E402
from poseidon_caffe.net_spec import L, NetSpec  # noqa: E402

# weights at the base rate with weight decay, biases at twice the rate without
LEARNING = [dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)]


def conv(n, name, bottom, num, kernel, stride=1, pad=0, group=1, bias=0.0):
    n[name] = L.Convolution(n[bottom], param=LEARNING, num_output=num, kernel_size=kernel,
                            stride=stride, pad=pad, group=group,
                            weight_filler=dict(type="gaussian", std=0.01),
                            bias_filler=dict(type="constant", value=bias))


def relu(n, name, blob):
    n[name] = L.ReLU(n[blob], in_place=True)


def lrn(n, name, bottom):
    n[name] = L.LRN(n[bottom], local_size=5, alpha=0.0001, beta=0.75)


def pool(n, name, bottom):
    n[name] = L.Pooling(n[bottom], pool="MAX", kernel_size=3, stride=2)


def fc(n, name, bottom, num, std, bias):
    n[name] = L.InnerProduct(n[bottom], param=LEARNING, num_output=num,
                             weight_filler=dict(type="gaussian", std=std),
                             bias_filler=dict(type="constant", value=bias))


def dropout(n, name, blob):
    n[name] = L.Dropout(n[blob], dropout_ratio=0.5, in_place=True)


def data(n, phase, source, batch, mirror):
    n.data, n.label = L.Data(ntop=2, include=dict(phase=phase),
                             transform_param=dict(
                                 mirror=mirror, crop_size=227,
                                 mean_file="data/ilsvrc12/imagenet_mean.binaryproto"),
                             source=source, batch_size=batch, backend="LMDB")


def alexnet():
    """The NetParameter of train_val.prototxt."""
    n = NetSpec()
    data(n, "TRAIN", "examples/imagenet/ilsvrc12_train_lmdb", 256, True)
    conv(n, "conv1", "data", 96, 11, stride=4)
    relu(n, "relu1", "conv1")
    lrn(n, "norm1", "conv1")
    pool(n, "pool1", "norm1")
    conv(n, "conv2", "pool1", 256, 5, pad=2, group=2, bias=0.1)
    relu(n, "relu2", "conv2")
    lrn(n, "norm2", "conv2")
    pool(n, "pool2", "norm2")
    conv(n, "conv3", "pool2", 384, 3, pad=1)
    relu(n, "relu3", "conv3")
    conv(n, "conv4", "conv3", 384, 3, pad=1, group=2, bias=0.1)
    relu(n, "relu4", "conv4")
    conv(n, "conv5", "conv4", 256, 3, pad=1, group=2, bias=0.1)
    relu(n, "relu5", "conv5")
    pool(n, "pool5", "conv5")
    fc(n, "fc6", "pool5", 4096, 0.005, 0.1)
    relu(n, "relu6", "fc6")
    dropout(n, "drop6", "fc6")
    fc(n, "fc7", "fc6", 4096, 0.005, 0.1)
    relu(n, "relu7", "fc7")
    dropout(n, "drop7", "fc7")
    fc(n, "fc8", "fc7", 1000, 0.01, 0.0)
    n.accuracy = L.Accuracy(n.fc8, n.label, include=dict(phase="TEST"))
    n.loss = L.SoftmaxWithLoss(n.fc8, n.label)
    net = n.to_proto()
    net.name = "AlexNet"
    # a NetSpec names each top once: the TEST phase's Data layer, with the same tops, is
    # built on its own and goes after the TRAIN one
    test = NetSpec()
    data(test, "TEST", "examples/imagenet/ilsvrc12_val_lmdb", 50, False)
    net.layer.insert(1, test.to_proto().layer[0])
    return net


if __name__ == "__main__":
    write_text_proto(alexnet(), os.path.join(HERE, "train_val.prototxt"))
