"""State filtering: which layers of a NetParameter a net of a given phase, level and stages
keeps (Caffe's NetState rules)."""
from ..proto import caffe_pb2
from .errors import NetError


def state_meets_rule(state, rule):
    """Caffe's StateMeetsRule: every condition the rule sets must hold for the state."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(s not in stages for s in rule.stage):
        return False
    if any(s in stages for s in rule.not_stage):
        return False
    return True


def filter_net(net_param, state):
    """A copy of ``net_param`` holding only the layers that ``state`` includes."""
    filtered = caffe_pb2.NetParameter()
    filtered.CopyFrom(net_param)
    del filtered.layer[:]
    for layer in net_param.layer:
        if layer.include and layer.exclude:
            raise NetError("layer %r specifies both include and exclude rules; give one or the "
                           "other" % layer.name)
        if layer.include:
            keep = any(state_meets_rule(state, r) for r in layer.include)
        else:
            keep = not any(state_meets_rule(state, r) for r in layer.exclude)
        if keep:
            filtered.layer.add().CopyFrom(layer)
    return filtered
