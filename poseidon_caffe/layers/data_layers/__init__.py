"""Layer family: data_layers — Data (LMDB, LevelDB), ImageData, WindowData, HDF5Data, HDF5Output.

  prefetching.py  the base of the prefetching layers: a loader run through a Prefetcher,
                  resume state, skip_batch(), close()
  datum_data.py   Data (LMDB or LevelDB of Datum records)
  image_data.py   ImageData (image files named by a list)
  window_data.py  WindowData (windows of images named by a window file)
  hdf5.py         HDF5Data and HDF5Output

The list and window file readers live in poseidon_caffe.data.lists (convert_imageset reads the
same lists); they are importable from here too.
"""
from ...data.lists import read_image_list, read_window_file  # noqa: F401
from .datum_data import DataLayer  # noqa: F401
from .hdf5 import HDF5DataLayer, HDF5OutputLayer  # noqa: F401
from .image_data import ImageDataLayer  # noqa: F401
from .prefetching import PrefetchingDataLayer  # noqa: F401
from .window_data import WindowDataLayer  # noqa: F401

_PrefetchingDataLayer = PrefetchingDataLayer   # the base's name before the split
