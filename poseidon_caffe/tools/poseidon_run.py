"""``poseidon-run -c config.json [-o OUTPUT_FOLDER] [--dry-run] CMD``: the command over
``launch/poseidon_run.py`` (see there for the config and what a run does).
"""
import argparse
import os
import shlex
import sys

from ..launch.poseidon_run import (CONFIG_KEYS, RUN_LOG, SSH_OVERRIDE_ENV, ConfigError, RunLog,
                                  check_log_dir, check_master, check_nodes, check_pem_file,
                                  default_log_dir, dry_run, load_config, rank_command, run_job)


def _parser():
    parser = argparse.ArgumentParser(
        prog="poseidon-run",
        usage="poseidon-run [-h] -c CLUSTER_CONFIG [-o OUTPUT_FOLDER] [--dry-run] CMD",
        description="Start CMD as one MPI job over ssh: one worker rank per entry of "
                    "worker_nodes, one dedicated parameter-server rank per entry of "
                    "server_nodes, the virtualenv activated on every node.",
        epilog="Example config: {\"virtualenv\": \"/opt/poseidon/venv\", \"username\": "
               "\"ubuntu\", \"pem_file\": \"~/.ssh/cluster.pem\", \"master_node\": "
               "\"192.168.1.10\", \"worker_nodes\": [\"192.168.1.11\", \"192.168.1.15\"], "
               "\"server_nodes\": [\"192.168.1.11\"]}. Passwords are refused: log in with keys. "
               "%s=PROGRAM runs PROGRAM in place of ssh." % SSH_OVERRIDE_ENV)
    parser.add_argument("-c", "--cluster_config", "--cluster-config", dest="config",
                        required=True, metavar="CLUSTER_CONFIG",
                        help="the cluster's JSON config (keys: %s)" % ", ".join(CONFIG_KEYS))
    parser.add_argument("-o", "--out", dest="out", metavar="OUTPUT_FOLDER",
                        help="folder for the job's logs (default: poseidon_log_<timestamp>)")
    parser.add_argument("--dry-run", "--print-commands", dest="dry_run", action="store_true",
                        help="print the ssh and mpiexec commands it would run, and run nothing")
    # REMAINDER: an unquoted command keeps its own options (poseidon-run -c C python t.py --lr 1)
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD",
                        help="the command every rank runs, as one quoted argument, e.g. "
                             "\"poseidon-caffe train --solver=solver.prototxt\"")
    return parser


# the other tools' single-dash help spellings (argparse would read -help as -h elp)
_HELP_SPELLINGS = ("-help", "-helpfull", "--helpfull", "-helpshort", "--helpshort")
_VALUED_OPTIONS = ("-c", "--cluster_config", "--cluster-config", "-o", "--out")


def _with_argparse_help(argv):
    """``argv`` with a help request among poseidon-run's own options (before CMD) spelled
    ``--help``; the command's own flags are left alone."""
    out = list(argv)
    takes_value = False
    for i, arg in enumerate(out):
        if takes_value:
            takes_value = False
        elif arg in _HELP_SPELLINGS:
            out[i] = "--help"
        elif arg in _VALUED_OPTIONS:
            takes_value = True
        elif arg == "--" or not arg.startswith("-"):
            break                                   # CMD starts here
    return out


def main(argv=None, stream=None):
    stream = stream or sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(_with_argparse_help(argv))
    if args.cmd[:1] == ["--"]:
        args.cmd = args.cmd[1:]
    if not args.cmd:
        parser.error("give the command to run, e.g. \"poseidon-caffe train --solver=S\"")
    command = shlex.split(args.cmd[0]) if len(args.cmd) == 1 else list(args.cmd)
    cwd = os.getcwd()
    try:
        log = None if args.dry_run else RunLog(os.path.join(cwd, RUN_LOG), stream)
    except OSError as exc:
        sys.stderr.write("poseidon-run: cannot write %s: %s\n"
                         % (os.path.join(cwd, RUN_LOG), exc.strerror))
        return 2
    try:
        if log:
            log("started in %s: poseidon-run %s" % (cwd, shlex.join(argv)))
        # a dry run shows the commands of a config written for other machines: a key that is
        # missing here is a note, not an error
        config = load_config(args.config, check_key=not args.dry_run)
        if args.dry_run and config.pem_file:
            try:
                check_pem_file(args.config, config.pem_file)
            except ConfigError as exc:
                sys.stderr.write("poseidon-run: note (a real run stops here): %s\n" % exc)
        log_dir = os.path.abspath(args.out) if args.out else default_log_dir(cwd)
        check_log_dir(log_dir)
        rank_command(config, command, log_dir)          # refuses a command that cannot run
        if args.dry_run:
            dry_run(config, command, log_dir, cwd, stream)
            return 0
        log("workers on %s; servers on %s; master %s"
            % (", ".join(config.workers),
               ", ".join(config.servers) or "none (the shards live beside the workers)",
               config.master or "this machine"))
        check_master(config)
        problems = check_nodes(config, cwd)
        if problems:
            for line in problems:
                log(line, error=True)
            return 2
        log("%d nodes ready; logs in %s" % (len(config.nodes), log_dir))
        return run_job(config, command, log_dir, cwd, log, stream)
    except (ConfigError, OSError) as exc:
        message = str(exc) if isinstance(exc, ConfigError) else \
            "%s: %s" % (exc.filename or "", exc.strerror or exc)
        if log:
            log(message, error=True)
        else:
            sys.stderr.write("poseidon-run: %s\n" % message)
        return 2
    except KeyboardInterrupt:
        if log:
            log("interrupted", error=True)
        return 130
    finally:
        if log:
            log.close()


if __name__ == "__main__":
    sys.exit(main())
