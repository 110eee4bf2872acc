"""The solver's numbers, checked when the solver is loaded rather than when they first bite.

Caffe accepts ``momentum: 1e30`` or ``max_iter: -1`` and fails hours later (a NaN loss, a
policy error after the first test pass), or never (a negative interval that silently turns a
feature off). Every rule below names the field; the ranges are those within which Caffe's
update rules are defined:

=====================================  ===============================================
field                                  accepted
=====================================  ===============================================
every float field                      finite (no nan, no inf)
base_lr, weight_decay                  >= 0
momentum, momentum2                    0 <= value < 1 (at 1 the history never decays and
                                       the update grows without bound)
delta                                  > 0 (it keeps the adaptive rules' division finite)
max_iter, display, snapshot,           >= 0 (0 turns display / snapshot / testing off)
test_interval, stepsize, device_id
test_iter (each)                       >= 0
test_interval, with test_iter given    > 0
iter_size, average_loss                >= 1
lr_policy                              fixed, step, exp, inv, multistep, poly, sigmoid
lr_policy "step"                       stepsize > 0
lr_policy "poly"                       max_iter > 0
lr_policy "multistep"                  stepvalue entries >= 0 and non-decreasing
=====================================  ===============================================
"""
from ..proto_values import describe_non_finite, non_finite_fields
from .lr_policy import POLICIES

# the nets inside a solver are checked, layer by layer, when they are built
_NET_FIELDS = ("net_param", "train_net_param", "test_net_param")


def solver_param_problems(param):
    """Every problem with the solver's values, each naming its field; [] when it can run."""
    problems = []
    bad = non_finite_fields(param, skip=_NET_FIELDS)
    if bad:
        problems.append("values must be finite numbers: %s" % describe_non_finite(bad))
    finite = {path for path, _ in bad}

    def check(field, ok, expected):
        if field in finite:
            return
        value = getattr(param, field)
        if not ok(value):
            problems.append("%s must be %s (got %s)" % (field, expected, _show(value)))

    check("base_lr", lambda v: v >= 0, ">= 0")
    check("weight_decay", lambda v: v >= 0, ">= 0")
    check("momentum", lambda v: 0 <= v < 1, "in [0, 1)")
    check("momentum2", lambda v: 0 <= v < 1, "in [0, 1)")
    check("delta", lambda v: v > 0, "> 0")
    for field in ("max_iter", "display", "snapshot", "test_interval", "stepsize", "device_id"):
        check(field, lambda v: v >= 0, ">= 0")
    for field in ("iter_size", "average_loss"):
        check(field, lambda v: v >= 1, ">= 1")
    for i, value in enumerate(param.test_iter):
        if value < 0:
            problems.append("test_iter[%d] must be >= 0 (got %d)" % (i, value))
    if len(param.test_iter) and param.test_interval == 0:
        # as Caffe: with test nets, an interval of 0 is an error, not "never test"
        problems.append("test_interval must be > 0 when test_iter is given (got 0)")

    policy = param.lr_policy
    if policy not in POLICIES:
        problems.append("lr_policy %s (expected one of %s)"
                        % ("%r is unknown" % policy if policy else "is not set",
                           ", ".join(POLICIES)))
    elif policy == "step" and param.stepsize <= 0:
        problems.append("lr_policy \"step\" needs stepsize > 0 (got %d)" % param.stepsize)
    elif policy == "poly" and param.max_iter <= 0:
        problems.append("lr_policy \"poly\" needs max_iter > 0 (got %d)" % param.max_iter)
    elif policy == "multistep":
        values = list(param.stepvalue)
        if any(v < 0 for v in values) or values != sorted(values):
            problems.append("lr_policy \"multistep\" needs stepvalue entries >= 0 in "
                            "non-decreasing order (got %s)" % values)
    return problems


def _show(value):
    return "%g" % value if isinstance(value, float) else str(value)
