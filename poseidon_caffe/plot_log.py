"""Training curves from one or more training logs in one picture (``poseidon-caffe plot``).

Rows of panels: loss (outputs whose name holds "loss"), accuracy (names holding "acc"), any
other outputs, and the learning rate; the left column against iterations, the right against
seconds since the start of solving.  Train curves are solid, test curves dashed, one colour per
log.  matplotlib (``pip install 'poseidon-caffe[plot]'``) draws through its Agg canvas only:
no display and no global backend change.
"""
import io as _io
import math
import os

from .training_log import columns, parse_log

__all__ = ["PlotError", "plot_logs"]

_FIXED_COLUMNS = ("NumIters", "Seconds", "LearningRate")
_X_AXES = (("NumIters", "iterations"), ("Seconds", "seconds"))
# one colour per log
_PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22", "#17becf"]


class PlotError(ValueError):
    """Nothing to plot, or a picture that cannot be written; the message says which."""


def _kind(name):
    low = name.lower()
    if "loss" in low:
        return "loss"
    if "acc" in low:
        return "accuracy"
    return "other outputs"


def _series(rows, column):
    xs_iter, xs_sec, ys = [], [], []
    for row in rows:
        value = row.get(column)
        if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
            continue
        xs_iter.append(row["NumIters"])
        xs_sec.append(row["Seconds"])
        ys.append(value)
    return {"NumIters": xs_iter, "Seconds": xs_sec}, ys


def _curves(log_paths):
    """Per panel row, the curves to draw: (log index, label, phase, {x axis: xs}, ys)."""
    panels = {"loss": [], "accuracy": [], "other outputs": [], "learning rate": []}
    for index, path in enumerate(log_paths):
        train, test = parse_log(path)
        if not train and not test:
            raise PlotError("%s holds no 'Train net output' or 'Test net output' lines" % path)
        name = os.path.basename(path)
        for phase, rows in (("train", train), ("test", test)):
            outputs = [c for c in columns(rows) if c not in _FIXED_COLUMNS]
            for output in outputs:
                xs, ys = _series(rows, output)
                if ys:
                    panels[_kind(output)].append((index, "%s %s %s" % (name, phase, output),
                                                  phase, xs, ys))
        # the rate belongs to the run, not a phase: both tables' rows, in iteration order
        both = sorted(train + test, key=lambda row: (row["NumIters"], row["Seconds"]))
        xs, ys = _series(both, "LearningRate")
        if ys:
            panels["learning rate"].append((index, "%s learning rate" % name, "train", xs, ys))
    return [(title, curves) for title, curves in panels.items() if curves]


def plot_logs(log_paths, output_path, width=1200, height=900, dpi=100):
    """Draw the curves of ``log_paths`` into ``output_path`` (PNG, SVG or PDF by extension),
    ``width`` x ``height`` pixels at ``dpi``."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'poseidon-caffe[plot]'") from None
    from .io import atomic_write
    ext = os.path.splitext(output_path)[1][1:].lower()
    if ext not in ("png", "svg", "pdf"):
        raise PlotError("%s: the picture's extension must be .png, .svg or .pdf" % output_path)
    rows = _curves(log_paths)
    if not rows:
        raise PlotError("no outputs to plot in %s" % ", ".join(log_paths))
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    FigureCanvasAgg(figure)
    colors = _PALETTE
    for r, (title, curves) in enumerate(rows):
        for c, (x_key, x_label) in enumerate(_X_AXES):
            axes = figure.add_subplot(len(rows), 2, 2 * r + c + 1)
            positive = True
            for index, label, phase, xs, ys in curves:
                # the rate holds from one logged value to the next: a step, not a slope
                axes.plot(xs[x_key], ys, color=colors[index % len(colors)],
                          linestyle="-" if phase == "train" else "--",
                          drawstyle="steps-post" if title == "learning rate" else "default",
                          marker="." if len(ys) < 50 else None, label=label)
                positive = positive and all(y > 0 for y in ys)
            if title == "learning rate" and positive and _spans_decades(curves):
                axes.set_yscale("log")
            axes.set_xlabel(x_label)
            axes.set_ylabel(title)
            axes.grid(True, alpha=0.3)
            if c == 0:
                axes.legend(fontsize="x-small", loc="best")
    figure.tight_layout()
    buffer = _io.BytesIO()
    figure.savefig(buffer, format=ext, dpi=dpi)
    atomic_write(output_path, buffer.getvalue())
    return [title for title, _ in rows]


def _spans_decades(curves):
    values = [y for _, _, _, _, ys in curves for y in ys]
    return max(values) >= 10 * min(values)
