"""``poseidon-caffe`` under the name ``python -m poseidon_caffe.cli`` and the console script
use. The commands live in ``poseidon_caffe/tools/``: ``tools/main.py`` finds the command,
``tools/caffe_tool.py`` holds train, test, time and device_query; their names answer here too.
"""
import sys

from .tools.caffe_tool import (ALL_FLAGS, BOSEN_KNOBS, CAFFE_FLAGS, COMMAND_USAGE,  # noqa: F401
                         COMMANDS, CONSISTENCY_MODELS, POSEIDON_FLAGS, SYNC_FLAGS,
                         CommandError, device_query, poseidon_flags, test, time_model, train,
                         world_size)
from .tools.main import TOOLS, USAGE, _load_tool, command_help, main  # noqa: F401

if __name__ == "__main__":
    sys.exit(main())
