"""The engine's items from a net: one per learnable blob, with the layer whose backward makes
its gradient final, the layer whose forward first needs it, and, for an InnerProduct weight,
where its sufficient factors are read (on the host, or on the device for a device net)."""
import numpy as np

from . import planner
from .engine import FactorSource, Item


def _factor_source(source):
    """The engine's FactorSource over a layer's sufficient-factor offer (float32 copies)."""
    read_factors = source["read"]

    def read():
        diff, data = read_factors()
        return np.array(diff, dtype=np.float32), np.array(data, dtype=np.float32)
    return FactorSource(source["inputs"], source["outputs"], read,
                        transpose=source["transpose"], rows_per_pass=source["rows_per_pass"])


def _device_factor_source(source, blobs):
    """A device net's factors are read from the layer's (bottom, top) blobs on the device
    (device_transfers.py)."""
    return FactorSource(source["inputs"], source["outputs"], None,
                        transpose=source["transpose"], rows_per_pass=source["rows_per_pass"],
                        device_blobs=blobs)


def build_items(net):
    """One Item per learnable blob of ``net``, with its ready and first-use layers."""
    items = []
    for index, name, blob, first, offer in planner.exchanged_params(net):
        factors = None
        if offer is not None:
            if blob.backend.on_device:
                # the offer is made only by the one layer using the blob: ``first``
                bottoms, tops = net.layer_blobs(first)
                factors = _device_factor_source(offer, (bottoms[0], tops[0]))
            else:
                factors = _factor_source(offer)
        items.append(Item(index, name, blob, ready_layer=first, first_use=first, sfb=factors))
    return items
