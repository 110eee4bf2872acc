"""Writes train_val.prototxt (GoogLeNet, Szegedy et al. 2014, with Caffe's bvlc_googlenet layer
names and its two auxiliary classifiers) reading ImageNet LMDBs made by convert_imageset.
Run: python examples/googlenet/make_prototxt.py"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PARAMS = "param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }"


def conv(name, bottom, num, kernel, stride=1, pad=0, std=None):
    weight = ('weight_filler { type: "gaussian" std: %g }' % std if std
              else 'weight_filler { type: "xavier" }')
    return ('layer { name: "%s" type: "Convolution" bottom: "%s" top: "%s" %s\n'
            '  convolution_param { num_output: %d kernel_size: %d stride: %d pad: %d %s\n'
            '    bias_filler { type: "constant" value: 0.2 } } }\n'
            'layer { name: "%s_relu" type: "ReLU" bottom: "%s" top: "%s" }\n'
            % (name, bottom, name, PARAMS, num, kernel, stride, pad, weight, name, name, name))


def pool(name, bottom, kind, kernel, stride, pad=0):
    return ('layer { name: "%s" type: "Pooling" bottom: "%s" top: "%s"\n'
            '  pooling_param { pool: %s kernel_size: %d stride: %d pad: %d } }\n'
            % (name, bottom, name, kind, kernel, stride, pad))


def lrn(name, bottom):
    return ('layer { name: "%s" type: "LRN" bottom: "%s" top: "%s"\n'
            '  lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 } }\n' % (name, bottom, name))


def fc(name, bottom, num, std=None):
    weight = ('weight_filler { type: "gaussian" std: %g }' % std if std
              else 'weight_filler { type: "xavier" }')
    return ('layer { name: "%s" type: "InnerProduct" bottom: "%s" top: "%s" %s\n'
            '  inner_product_param { num_output: %d %s bias_filler { type: "constant" value: 0 } '
            '} }\n' % (name, bottom, name, PARAMS, num, weight))


def inception(name, bottom, n1, n3r, n3, n5r, n5, npool):
    p = name + "/"
    text = conv(p + "1x1", bottom, n1, 1)
    text += conv(p + "3x3_reduce", bottom, n3r, 1) + conv(p + "3x3", p + "3x3_reduce", n3, 3, pad=1)
    text += conv(p + "5x5_reduce", bottom, n5r, 1) + conv(p + "5x5", p + "5x5_reduce", n5, 5, pad=2)
    text += pool(p + "pool", bottom, "MAX", 3, 1, 1) + conv(p + "pool_proj", p + "pool", npool, 1)
    text += ('layer { name: "%soutput" type: "Concat" bottom: "%s1x1" bottom: "%s3x3" '
             'bottom: "%s5x5" bottom: "%spool_proj" top: "%soutput" }\n' % (p, p, p, p, p, p))
    return text, p + "output"


def loss(name, bottom, weight, test_top):
    return ('layer { name: "%s/loss" type: "SoftmaxWithLoss" bottom: "%s" bottom: "label" '
            'top: "%s/loss" loss_weight: %g }\n'
            'layer { name: "%s/top-1" type: "Accuracy" bottom: "%s" bottom: "label" '
            'top: "%s/top-1" include { phase: TEST } }\n'
            'layer { name: "%s/top-5" type: "Accuracy" bottom: "%s" bottom: "label" '
            'top: "%s/top-5" include { phase: TEST } accuracy_param { top_k: 5 } }\n'
            % (test_top, bottom, test_top, weight, test_top, bottom, test_top, test_top, bottom,
               test_top))


def auxiliary(prefix, bottom):
    text = pool(prefix + "/ave_pool", bottom, "AVE", 5, 3)
    text += conv(prefix + "/conv", prefix + "/ave_pool", 128, 1)
    text += fc(prefix + "/fc", prefix + "/conv", 1024)
    text += 'layer { name: "%s/relu_fc" type: "ReLU" bottom: "%s/fc" top: "%s/fc" }\n' % (
        prefix, prefix, prefix)
    text += ('layer { name: "%s/drop_fc" type: "Dropout" bottom: "%s/fc" top: "%s/fc" '
             'dropout_param { dropout_ratio: 0.7 } }\n' % (prefix, prefix, prefix))
    text += fc(prefix + "/classifier", prefix + "/fc", 1000)
    return text + loss(prefix, prefix + "/classifier", 0.3, prefix)


def data(phase, source, batch, mirror):
    return ('layer { name: "data" type: "Data" top: "data" top: "label" include { phase: %s }\n'
            '  transform_param { mirror: %s crop_size: 224 mean_value: 104 mean_value: 117 '
            'mean_value: 123 }\n  data_param { source: "%s" batch_size: %d backend: LMDB } }\n'
            % (phase, "true" if mirror else "false", source, batch))


def googlenet():
    text = 'name: "GoogleNet"\n'
    text += data("TRAIN", "examples/imagenet/ilsvrc12_train_lmdb", 32, True)
    text += data("TEST", "examples/imagenet/ilsvrc12_val_lmdb", 50, False)
    text += conv("conv1/7x7_s2", "data", 64, 7, stride=2, pad=3)
    text += pool("pool1/3x3_s2", "conv1/7x7_s2", "MAX", 3, 2) + lrn("pool1/norm1", "pool1/3x3_s2")
    text += conv("conv2/3x3_reduce", "pool1/norm1", 64, 1)
    text += conv("conv2/3x3", "conv2/3x3_reduce", 192, 3, pad=1)
    text += lrn("conv2/norm2", "conv2/3x3") + pool("pool2/3x3_s2", "conv2/norm2", "MAX", 3, 2)
    top = "pool2/3x3_s2"
    modules = [("inception_3a", 64, 96, 128, 16, 32, 32), ("inception_3b", 128, 128, 192, 32, 96, 64),
               "pool3", ("inception_4a", 192, 96, 208, 16, 48, 64), "loss1",
               ("inception_4b", 160, 112, 224, 24, 64, 64), ("inception_4c", 128, 128, 256, 24, 64, 64),
               ("inception_4d", 112, 144, 288, 32, 64, 64), "loss2",
               ("inception_4e", 256, 160, 320, 32, 128, 128), "pool4",
               ("inception_5a", 256, 160, 320, 32, 128, 128), ("inception_5b", 384, 192, 384, 48, 128, 128)]
    for m in modules:
        if m in ("pool3", "pool4"):
            text += pool(m + "/3x3_s2", top, "MAX", 3, 2)
            top = m + "/3x3_s2"
        elif m in ("loss1", "loss2"):
            text += auxiliary(m, top)
        else:
            module, top = inception(m[0], top, *m[1:])
            text += module
    text += pool("pool5/7x7_s1", top, "AVE", 7, 1)
    text += ('layer { name: "pool5/drop_7x7_s1" type: "Dropout" bottom: "pool5/7x7_s1" '
             'top: "pool5/7x7_s1" dropout_param { dropout_ratio: 0.4 } }\n')
    text += fc("loss3/classifier", "pool5/7x7_s1", 1000)
    return text + loss("loss3", "loss3/classifier", 1.0, "loss3")


if __name__ == "__main__":
    with open(os.path.join(HERE, "train_val.prototxt"), "w") as f:
        f.write(googlenet())
