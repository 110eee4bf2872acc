"""The simulator's answer as rows: a text table, JSON, and a speedup plot (PNG, SVG or PDF;
matplotlib, imported only when a plot is asked for)."""
import json
import os

from .model import SimulationError

COLUMNS = (("nodes", "%5d"), ("gpus", "%5d"), ("iter_ms", "%10.1f"), ("images_per_s", "%10.1f"),
           ("speedup", "%8.2f"), ("compute_ms", "%10.1f"), ("comm_ms", "%9.1f"),
           ("hidden", "%7.2f"), ("mib_per_host", "%11.1f"))
HEADERS = {"images_per_s": "images/s", "mib_per_host": "MiB/host"}
MIB = float(1 << 20)      # byte sizes are binary and named so everywhere (memory.format_bytes)


def rows(predictions, baseline):
    """One dict per prediction; speedup is throughput over ``baseline``'s (one node of the
    same GPUs per node)."""
    out = []
    for p in predictions:
        strategies = {}
        for name in p.plan.values():
            strategies[name] = strategies.get(name, 0) + 1
        out.append({
            "nodes": p.cluster.hosts, "gpus": p.cluster.workers,
            "iter_ms": p.iter_s * 1e3, "images_per_s": p.images_per_s,
            "speedup": p.images_per_s / baseline.images_per_s,
            "compute_ms": p.compute_s * 1e3, "comm_ms": p.comm_s * 1e3,
            "hidden": p.hidden_share, "mib_per_host": p.host_bytes / MIB,
            "plan": strategies,
        })
    return out


def table(rows_):
    head = " ".join(("%" + fmt[1:].split(".")[0].rstrip("df") + "s") % HEADERS.get(name, name)
                    for name, fmt in COLUMNS)
    lines = [head]
    for row in rows_:
        lines.append(" ".join(fmt % row[name] for name, fmt in COLUMNS))
    return "\n".join(lines)


def write_json(rows_, path, inputs):
    from ..io import atomic_write
    doc = {"inputs": inputs, "rows": rows_}
    try:
        atomic_write(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    except OSError as exc:
        raise SimulationError("-json=%s cannot be written: %s" % (path, exc.strerror or exc)) \
            from None


def plot_speedups(series, path, title="", references=None, width=640, height=420, dpi=100):
    """Speedup against nodes: ``series`` {label: rows}, ``references`` {label: [(nodes,
    speedup)]} drawn as unjoined markers, and the linear line."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise SimulationError("-plot needs matplotlib: pip install 'poseidon-caffe[plot]'") \
            from None
    from ..io import atomic_write
    import io as _io
    ext = os.path.splitext(path)[1][1:].lower()
    if ext not in ("png", "svg", "pdf"):
        raise SimulationError("-plot=%s: the picture's extension must be .png, .svg or .pdf"
                              % path)
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    most = 1
    colours = {}
    for k, (label, rows_) in enumerate(series.items()):
        xs = [r["nodes"] for r in rows_]
        ys = [r["speedup"] for r in rows_]
        most = max([most] + xs)
        line, = ax.plot(xs, ys, marker="o", label=label)
        colours[label] = line.get_color()
    for label, points in (references or {}).items():
        xs = [x for x, _ in points]
        most = max([most] + xs)
        base = label.split(" (")[0]
        ax.plot(xs, [y for _, y in points], linestyle="none", marker="s", markerfacecolor="none",
                color=colours.get(base), label=label)
    ax.plot([1, most], [1, most], color="grey", linestyle=":", label="linear")
    ax.set_xlabel("nodes")
    ax.set_ylabel("speedup over one node")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    buffer = _io.BytesIO()
    figure.savefig(buffer, format=ext)
    try:
        atomic_write(path, buffer.getvalue())
    except OSError as exc:
        raise SimulationError("-plot=%s cannot be written: %s" % (path, exc.strerror or exc)) \
            from None
