"""``python -m poseidon_caffe.tools.mnist [DIRECTORY]``: the quick start's MNIST LMDBs
(``data/mnist_embedded.py``) written into DIRECTORY (default examples/mnist), once.
"""
import os
import sys

from .. import log
from ..data.db import DataError
from ..data.mnist_embedded import ensure_mnist_lmdbs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    directory = argv[0] if argv else os.path.join("examples", "mnist")
    try:
        ensure_mnist_lmdbs(directory)
    except DataError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
