"""Debug output: the per-layer lines Caffe's ``debug_info`` logs in forward and backward."""
import numpy as np

from .. import log


class DebugOutput:
    """Part of ``Net``: the lines logged when the NetParameter sets ``debug_info``."""

    @staticmethod
    def _mean_abs(array):
        return float(np.abs(array).mean()) if array.size else 0.0

    def _forward_debug_info(self, i):
        for bid in self.top_ids[i]:
            log.info("    [Forward] Layer %s, top blob %s data: %g", self.layer_names[i],
                     self.blob_names[bid], self._mean_abs(self._blobs[bid].data))
        for j, blob in enumerate(self.layers[i].blobs):
            log.info("    [Forward] Layer %s, param blob %d data: %g", self.layer_names[i], j,
                     self._mean_abs(blob.data))

    def _backward_debug_info(self, i):
        for j, bid in enumerate(self.bottom_ids[i]):
            if self.bottom_need_backward[i][j]:
                log.info("    [Backward] Layer %s, bottom blob %s diff: %g", self.layer_names[i],
                         self.blob_names[bid], self._mean_abs(self._blobs[bid].diff))
        for j, blob in enumerate(self.layers[i].blobs):
            if self.layers[i].param_propagate_down[j]:
                log.info("    [Backward] Layer %s, param blob %d diff: %g",
                         self.layer_names[i], j, self._mean_abs(blob.diff))

    def _update_debug_summary(self):
        data = sum(float(np.abs(b.data).sum()) for b in self.learnable_params)
        diff = sum(float(np.abs(b.diff).sum()) for b in self.learnable_params)
        log.info("    [Backward] All net params (data, diff): L1 norm = (%g, %g)", data, diff)
