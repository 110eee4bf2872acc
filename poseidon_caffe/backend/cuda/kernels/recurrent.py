"""The kernels of recurrent.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, c, hidden, y)
rows_scale = Kernel("recurrent", "rows_scale", "iPPiP")
# (n, c_prev, gates, cont, hidden, c, h, acts, tanh_c)
lstm_unit_forward = Kernel("recurrent", "lstm_unit_forward", "iPPPiPPPP")
# (n, c_prev, cont, acts, tanh_c, dc, dh, hidden, dc_prev, dgates)
lstm_unit_backward = Kernel("recurrent", "lstm_unit_backward", "iPPPPPPiPP")
