"""Parity X-ray domain layer: capture I/O, alignment, diffs, token parity, saved sessions.

Nothing here imports Qt. Filter-plugin loading is disabled before h5py is first imported
anywhere in the process, because an unknown filter id in an untrusted capture would make
libhdf5 load every shared object on HDF5_PLUGIN_PATH (docs/capture-format.md, "What a reader refuses").
"""

import os

os.environ["HDF5_PLUGIN_PRELOAD"] = "::"
