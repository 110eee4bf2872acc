"""The sync flags read once into SyncOptions: train's namespace (empty flags take their
defaults, flags that are not sync's are ignored), a dict, or nothing."""
import types

from poseidon_caffe.sync.offload import OFFLOAD_SIZE
from poseidon_caffe.sync.options import SyncOptions


def test_unset_and_empty_flags_take_the_defaults():
    flags = types.SimpleNamespace(sync="", svb=None, staleness=0, dwbp=True, solver="s.prototxt",
                                  output_dir="", gpu="", sync_timeout=None)
    options = SyncOptions.of(flags)
    assert options == SyncOptions()
    assert (options.sync, options.svb, options.ps_update, options.offload_size) == \
        ("auto", None, "server", OFFLOAD_SIZE)
    assert SyncOptions.of(None) == SyncOptions()


def test_values_are_taken_in_their_types_from_flags_or_text():
    options = SyncOptions.of({"sync": "ps", "staleness": "2", "dwbp": "false", "svb": "true",
                              "sync_timeout": "7", "comm_channels": 3, "server_ranks": 1})
    assert options.sync == "ps" and options.staleness == 2 and options.dwbp is False
    assert options.svb is True and options.sync_timeout == 7.0
    assert options.comm_channels == 3 and options.server_ranks == 1
    assert SyncOptions.of(types.SimpleNamespace(svb=False, dwbp=False)).svb is False
    given = SyncOptions(sync="sfb")
    assert SyncOptions.of(given) is given
