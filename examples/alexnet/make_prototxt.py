"""Writes train_val.prototxt (AlexNet, as in Krizhevsky et al. 2012 with Caffe's layer names)
reading ImageNet LMDBs made by convert_imageset. Run: python examples/alexnet/make_prototxt.py"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def filler(kind, value):
    return ('weight_filler { type: "gaussian" std: %g }' % value if kind == "gaussian"
            else 'bias_filler { type: "constant" value: %g }' % value)


def conv(name, bottom, num, kernel, stride=1, pad=0, group=1, bias=0.0):
    return ('layer { name: "%s" type: "Convolution" bottom: "%s" top: "%s"\n'
            '  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }\n'
            '  convolution_param { num_output: %d kernel_size: %d stride: %d pad: %d group: %d\n'
            '    %s %s } }\n' % (name, bottom, name, num, kernel, stride, pad, group,
                                 filler("gaussian", 0.01), filler("constant", bias)))


def relu(name, blob):
    return 'layer { name: "%s" type: "ReLU" bottom: "%s" top: "%s" }\n' % (name, blob, blob)


def lrn(name, bottom):
    return ('layer { name: "%s" type: "LRN" bottom: "%s" top: "%s"\n'
            '  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }\n' % (name, bottom, name))


def pool(name, bottom):
    return ('layer { name: "%s" type: "Pooling" bottom: "%s" top: "%s"\n'
            '  pooling_param { pool: MAX kernel_size: 3 stride: 2 } }\n' % (name, bottom, name))


def fc(name, bottom, num, std, bias):
    return ('layer { name: "%s" type: "InnerProduct" bottom: "%s" top: "%s"\n'
            '  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }\n'
            '  inner_product_param { num_output: %d %s %s } }\n'
            % (name, bottom, name, num, filler("gaussian", std), filler("constant", bias)))


def dropout(name, blob):
    return ('layer { name: "%s" type: "Dropout" bottom: "%s" top: "%s"\n'
            '  dropout_param { dropout_ratio: 0.5 } }\n' % (name, blob, blob))


def data(phase, source, batch, mirror):
    return ('layer { name: "data" type: "Data" top: "data" top: "label" include { phase: %s }\n'
            '  transform_param { mirror: %s crop_size: 227 '
            'mean_file: "data/ilsvrc12/imagenet_mean.binaryproto" }\n'
            '  data_param { source: "%s" batch_size: %d backend: LMDB } }\n'
            % (phase, "true" if mirror else "false", source, batch))


def alexnet():
    text = 'name: "AlexNet"\n'
    text += data("TRAIN", "examples/imagenet/ilsvrc12_train_lmdb", 256, True)
    text += data("TEST", "examples/imagenet/ilsvrc12_val_lmdb", 50, False)
    text += conv("conv1", "data", 96, 11, stride=4) + relu("relu1", "conv1")
    text += lrn("norm1", "conv1") + pool("pool1", "norm1")
    text += conv("conv2", "pool1", 256, 5, pad=2, group=2, bias=0.1) + relu("relu2", "conv2")
    text += lrn("norm2", "conv2") + pool("pool2", "norm2")
    text += conv("conv3", "pool2", 384, 3, pad=1) + relu("relu3", "conv3")
    text += conv("conv4", "conv3", 384, 3, pad=1, group=2, bias=0.1) + relu("relu4", "conv4")
    text += conv("conv5", "conv4", 256, 3, pad=1, group=2, bias=0.1) + relu("relu5", "conv5")
    text += pool("pool5", "conv5")
    text += fc("fc6", "pool5", 4096, 0.005, 0.1) + relu("relu6", "fc6") + dropout("drop6", "fc6")
    text += fc("fc7", "fc6", 4096, 0.005, 0.1) + relu("relu7", "fc7") + dropout("drop7", "fc7")
    text += fc("fc8", "fc7", 1000, 0.01, 0.0)
    text += ('layer { name: "accuracy" type: "Accuracy" bottom: "fc8" bottom: "label" '
             'top: "accuracy" include { phase: TEST } }\n')
    text += ('layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc8" bottom: "label" '
             'top: "loss" }\n')
    return text


if __name__ == "__main__":
    with open(os.path.join(HERE, "train_val.prototxt"), "w") as f:
        f.write(alexnet())
