"""Caffe's update of one parameter (its ApplyUpdate), written once: normalise the gradient by
``iter_size``, regularise it (weight decay times the blob's decay multiplier), turn it into
the update value of the solver's rule (``updates.py``; the history advances) at the learning
rate times the blob's lr multiplier, and subtract that from the weights. The solver applies it
to its net's blobs; a worker's exchanges and a parameter-server shard apply the same to the
slices they hold (``sync/update_rules.py``), so every one of them computes Caffe's numbers."""
from . import updates


class UpdateRule:
    """The update of the solver ``kind`` ("SGD", "Adam", ...) with the solver's fields
    ``param``; ``lr_mult`` and ``decay_mult`` map a parameter's index to its multipliers."""

    def __init__(self, param, kind, lr_mult, decay_mult):
        self.param = param
        self.kind = kind
        self.lr_mult = lr_mult
        self.decay_mult = decay_mult

    def local_rate(self, index, rate):
        return rate * self.lr_mult[index]

    def local_decay(self, index):
        return self.param.weight_decay * self.decay_mult[index]

    def compute(self, index, data, diff, history, rate, iteration):
        """Turn the gradient in ``diff`` into the update value, in place (``history``
        advances); ``data`` is read for weight decay only. ``rate``: the solver's rate."""
        p = self.param
        updates.normalize(diff, p.iter_size)
        updates.regularize(data, diff, self.local_decay(index), p.regularization_type)
        updates.update_value(self.kind, p, diff, history, self.local_rate(index, rate),
                             iteration)

    def apply(self, index, data, diff, history, rate, iteration):
        """The whole update on host arrays: ``data -= update(diff)``."""
        self.compute(index, data, diff, history, rate, iteration)
        data -= diff

    def apply_on_device(self, backend, index, data, diff, history, rate, iteration):
        """The whole update in the device's kernels (updates.cu), the same steps in order."""
        p = self.param
        backend.solver_update(self.kind, p, data, diff, history,
                              self.local_rate(index, rate), iteration, p.iter_size,
                              self.local_decay(index), p.regularization_type)
