"""Split insertion: a top used by several bottoms feeds a Split layer (Caffe's InsertSplits)."""
from ..proto import caffe_pb2
from .errors import NetError


def split_layer_name(blob_name, layer_name, top_index):
    return "%s_%s_%d_split" % (blob_name, layer_name, top_index)


def split_blob_name(blob_name, layer_name, top_index, split_index):
    return "%s_%s_%d_split_%d" % (blob_name, layer_name, top_index, split_index)


def insert_splits(net_param):
    """Caffe's InsertSplits: a top used by several bottoms (a loss counts as one use) feeds a
    Split layer whose outputs go one to each user, so that their gradients are summed."""
    producer = {}                      # blob name -> (layer index, top index) of latest producer
    uses = {}                          # (layer index, top index) -> number of consumers
    consumer_of = {}                   # (layer index, bottom index) -> producing (layer, top)
    for i, layer in enumerate(net_param.layer):
        for j, name in enumerate(layer.bottom):
            if name not in producer:
                raise NetError("Unknown bottom blob %r (layer %r, bottom index %d)"
                               % (name, layer.name, j))
            key = producer[name]
            consumer_of[(i, j)] = key
            uses[key] = uses.get(key, 0) + 1
        for j, name in enumerate(layer.top):
            producer[name] = (i, j)
    loss_weight_of = {}
    for i, layer in enumerate(net_param.layer):
        for j, weight in enumerate(layer.loss_weight):
            if weight:
                loss_weight_of[(i, j)] = weight
                uses[(i, j)] = uses.get((i, j), 0) + 1

    out = caffe_pb2.NetParameter()
    out.CopyFrom(net_param)
    del out.layer[:]
    split_taken = {}                   # (layer, top) -> next split output to hand out
    for i, layer in enumerate(net_param.layer):
        new_layer = out.layer.add()
        new_layer.CopyFrom(layer)
        for j, name in enumerate(layer.bottom):
            key = consumer_of[(i, j)]
            if uses.get(key, 0) > 1:
                k = split_taken.get(key, 0)
                split_taken[key] = k + 1
                src = net_param.layer[key[0]]
                new_layer.bottom[j] = split_blob_name(name, src.name, key[1], k)
        for j, name in enumerate(layer.top):
            count = uses.get((i, j), 0)
            if count <= 1:
                continue
            split = out.layer.add()
            split.name = split_layer_name(name, layer.name, j)
            split.type = "Split"
            split.bottom.append(name)
            for k in range(count):
                split.top.append(split_blob_name(name, layer.name, j, k))
            weight = loss_weight_of.get((i, j))
            if weight:
                # the loss use takes the first split output, as in Caffe
                split.loss_weight.append(weight)
                split.loss_weight.extend([0.0] * (count - 1))
                split_taken[(i, j)] = 1
                del new_layer.loss_weight[:]
                for jj in range(len(layer.top)):
                    new_layer.loss_weight.append(0.0 if jj == j
                                                 else loss_weight_of.get((i, jj), 0.0))
    return out
