#!/usr/bin/env python
"""Hosts on a real, shaped network on one machine: the face of poseidon_caffe/tools/netlab.py.

    python scripts/netlab.py run --hosts 2 --bandwidth 1gbit -- \
        python examples/mnist/run_local.py {hostfile}
    python scripts/netlab.py up|exec|down|list ...      (python scripts/netlab.py -h)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ == "__main__":
    from poseidon_caffe.tools.netlab import main
    sys.exit(main())
