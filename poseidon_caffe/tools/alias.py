"""``poseidon-caffe alias install|remove|status [--target DIR]``: the opt-in ``import caffe``
(``caffe_alias.py``).
"""
import argparse
import os
import sys

from ..caffe_alias import AliasError, default_target, install, remove, status


def alias_main(argv):
    parser = argparse.ArgumentParser(
        prog="poseidon-caffe alias",
        description="Make `import caffe` load poseidon-caffe in this environment (opt-in). "
                    "Refuses where a real Caffe is importable.")
    parser.add_argument("action", choices=("install", "remove", "status"))
    parser.add_argument("--target", default="",
                        help="directory to write the alias package into (default: this "
                             "environment's site-packages, %s)" % default_target())
    args = parser.parse_args(argv)
    target = args.target or None
    try:
        if args.action == "install":
            path = install(target)
            print("installed: `import caffe` now loads poseidon_caffe (%s)" % path)
            if target and os.path.abspath(target) not in [os.path.abspath(p or os.getcwd())
                                                          for p in sys.path]:
                print("put %s on PYTHONPATH to use it" % os.path.abspath(target))
        elif args.action == "remove":
            path = remove(target)
            print("removed %s" % path if path else "no alias installed in %s"
                  % os.path.abspath(target or default_target()))
        else:
            installed, real = status(target)
            print("alias: %s" % (installed or "not installed in %s"
                                 % os.path.abspath(target or default_target())))
            print("real Caffe: %s" % (", ".join(real) if real else "none importable"))
    except (AliasError, OSError) as exc:
        sys.stderr.write("poseidon-caffe alias %s: %s\n" % (args.action, exc))
        return 1
    return 0
