"""Layer family: data_layers (see hdf5.py)."""
from .hdf5 import (DataLayer, HDF5DataLayer, HDF5OutputLayer, ImageDataLayer,  # noqa: F401
                   WindowDataLayer, read_image_list, read_window_file)
