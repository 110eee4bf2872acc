"""``poseidon-caffe plot [FLAGS] LOGFILE [LOGFILE ...] -o curves.png``: training curves of
several logs in one picture (``plot_log.py``).
"""
import sys

from .. import log
from ..plot_log import PlotError, plot_logs
from ..training_log import LogParseError
from . import flags as flagmod

PLOT_FLAGS = [
    flagmod.Flag("o", "curves.png", "The picture to write (.png, .svg or .pdf)"),
    flagmod.Flag("size", "1200x900", "The picture's size in pixels, WIDTHxHEIGHT"),
    flagmod.Flag("dpi", 100, "Dots per inch (text and lines scale with it)"),
]

PLOT_USAGE = """Plot loss, accuracy and learning rate of training logs against iterations and
seconds, train and test, several logs in one picture.
Usage:
    plot [FLAGS] LOGFILE [LOGFILE ...] -o curves.png
"""


@flagmod.documented(PLOT_USAGE, PLOT_FLAGS)
def plot_main(argv):
    if any(a in ("-h", "-help", "--help") for a in argv):
        sys.stdout.write("%s\nFlags:\n%s\n" % (PLOT_USAGE, flagmod.usage(PLOT_FLAGS)))
        return 0
    try:
        values, logs = flagmod.parse(argv, PLOT_FLAGS)
        if not logs:
            raise flagmod.FlagError("plot needs at least one LOGFILE")
        width, _, height = values["size"].lower().partition("x")
        try:
            width, height = int(width), int(height)
        except ValueError:
            raise flagmod.FlagError("-size takes WIDTHxHEIGHT in pixels (1200x900), not %r"
                                    % values["size"]) from None
        if width < 100 or height < 100 or values["dpi"] <= 0:
            raise flagmod.FlagError("-size needs at least 100x100 pixels and -dpi a positive "
                                    "number")
    except flagmod.FlagError as exc:
        log.error("plot: %s", exc)
        return 1
    try:
        titles = plot_logs(logs, values["o"], width, height, values["dpi"])
    except (PlotError, LogParseError, OSError) as exc:
        log.error("plot: %s", exc)
        return 1
    log.info("Plotted %s of %d log(s) to %s", ", ".join(titles), len(logs), values["o"])
    return 0
