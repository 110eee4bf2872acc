"""The kernels of rows.cu, as named objects (written by scripts/kernel_stubs.py from the
source's KERNEL declarations; a test checks they agree)."""
from ..launch import Kernel

# (n, x, rows, inner, y)
rows_gather = Kernel("rows", "rows_gather", "iPPiP")
# (n, dy, rows, count, inner, dx)
rows_scatter_add = Kernel("rows", "rows_scatter_add", "iPPiiP")
