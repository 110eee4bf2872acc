"""``poseidon-caffe parse_log [FLAGS] LOGFILE [OUTPUT_DIR]``: a training log -> LOG.train and
LOG.test tables (``training_log.py``), as Caffe's tools/extra/parse_log.py.
"""
import os
import sys

from .. import log
from ..training_log import LogParseError, parse_log, save_csv_files
from . import flags as flagmod

PARSE_FLAGS = [
    flagmod.Flag("delimiter", ",", "Column delimiter in the output files"),
    flagmod.Flag("verbose", False, "Say which files were written"),
]

PARSE_USAGE = """Parse a Caffe training log into two CSV files of training and test outputs.
Usage:
    parse_log [FLAGS] LOGFILE [OUTPUT_DIR]
Writes OUTPUT_DIR/LOGFILE.train and OUTPUT_DIR/LOGFILE.test (OUTPUT_DIR defaults to the log's
own directory, and is made when it does not exist).
"""


@flagmod.documented(PARSE_USAGE, PARSE_FLAGS)
def parse_log_main(argv):
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write("%s\nFlags:\n%s\n" % (PARSE_USAGE, flagmod.usage(PARSE_FLAGS)))
        return 0
    try:
        values, args = flagmod.parse(argv, PARSE_FLAGS)
        if len(args) not in (1, 2):
            raise flagmod.FlagError("parse_log takes LOGFILE [OUTPUT_DIR], got %d argument(s)"
                                    % len(args))
        if len(values["delimiter"]) != 1:
            raise flagmod.FlagError("-delimiter takes one character, not %r" % values["delimiter"])
    except flagmod.FlagError as exc:
        log.error("parse_log: %s", exc)
        return 1
    log_path = args[0]
    output_dir = args[1] if len(args) == 2 else (os.path.dirname(os.path.abspath(log_path)))
    try:
        train, test = parse_log(log_path)
        if not train and not test:
            raise LogParseError("%s holds no 'Train net output' or 'Test net output' lines"
                                % log_path)
        save_csv_files(log_path, output_dir, train, test, values["delimiter"], values["verbose"])
    except (LogParseError, ValueError, OSError) as exc:
        log.error("parse_log: %s", exc)
        return 1
    return 0
