"""Per-layer forward and backward times for the simulator: read from a file, measured here
with the timing ``time`` uses, or spread over the layers from one per-iteration figure.

A compute file gives one worker's time per iteration for each layer of the TRAIN net, in
milliseconds, in one of three forms:

* CSV: a header ``layer,forward_ms,backward_ms``, then one line per layer; a line
  ``# batch: 32`` (anywhere) says at which batch the times were taken.
* JSON: ``{"batch": 32, "layers": [{"name": "conv1", "forward_ms": 1.5, "backward_ms": 3.1},
  ...]}`` (``batch`` optional; a bare list of the layer objects also does).
* The log of ``poseidon-caffe time`` (or Caffe's): its ``NAME<tab>forward: X ms.`` and
  ``NAME<tab>backward: Y ms.`` lines.
* The report ``scripts/bench_gpu.py --json`` writes (``{"device": ..., "nets": {"alexnet":
  {"batch": 128, "layers": [...]}, ...}}``): the net whose layers are the simulated net's is
  taken, with its batch.

Every layer of the net needs a line, but the Split layers the net inserts itself (a copy of a
blob that feeds several layers), which count 0 when absent; a file that names a layer the net
does not have is refused. When the file states a batch and the net's differs, the times are
scaled by the ratio of the two (a first approximation: a GPU is less than linear at small
batches).
"""
import csv
import io
import json
import math
import re

from .model import SimulationError


class LayerTimes:
    """Milliseconds per layer (net order) of one worker's forward and backward."""

    def __init__(self, forward_ms, backward_ms, source="", note=""):
        self.forward_ms = [float(v) for v in forward_ms]
        self.backward_ms = [float(v) for v in backward_ms]
        self.source = source
        self.note = note

    @property
    def total_ms(self):
        return sum(self.forward_ms) + sum(self.backward_ms)

    def scaled(self, factor):
        return LayerTimes([v * factor for v in self.forward_ms],
                          [v * factor for v in self.backward_ms], self.source, self.note)


_TIME_LINE = re.compile(r"(?:^|\]\s|\s)\s*(\S+)\s*\t(forward|backward): ([-+0-9.eE]+) ms\.\s*$")


def _number(text, path, where):
    try:
        value = float(text)
    except (TypeError, ValueError, OverflowError):
        value = float("nan")
    if not math.isfinite(value) or value < 0:
        raise SimulationError("%s: %s: %r is not a time in milliseconds (a number >= 0)"
                              % (path, where, text))
    return value


def _cells(line, path, number):
    try:
        return [c.strip() for c in next(csv.reader([line]))]
    except (csv.Error, StopIteration) as exc:
        raise SimulationError("%s: line %d is not a CSV line (%s)" % (path, number, exc)) \
            from None


def _from_csv(text, path):
    batch = None
    rows = []
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("#"):
            found = re.fullmatch(r"#\s*batch\s*[:=]\s*(\S+)", stripped)
            if found:
                batch = _batch_value(found.group(1), path, "line %d" % number)
            continue
        if stripped:
            lines.append((number, line))
    if not lines:
        raise SimulationError("%s: no layer times (expected a header layer,forward_ms,"
                              "backward_ms and one line per layer)" % path)
    header = _cells(lines[0][1], path, lines[0][0])
    if header[:3] != ["layer", "forward_ms", "backward_ms"]:
        raise SimulationError("%s: line %d: the header must be layer,forward_ms,backward_ms, "
                              "not %s" % (path, lines[0][0], ",".join(header)))
    for number, line in lines[1:]:
        cells = _cells(line, path, number)
        if len(cells) < 3:
            raise SimulationError("%s: line %d: expected layer,forward_ms,backward_ms, got %r"
                                  % (path, number, line.strip()))
        where = "line %d" % number
        rows.append((cells[0], _number(cells[1], path, where + " forward_ms"),
                     _number(cells[2], path, where + " backward_ms"), where))
    return rows, batch


def _batch_value(value, path, where):
    try:
        batch = int(value)
    except (TypeError, ValueError, OverflowError):
        batch = 0
    if batch <= 0 or str(value).strip() not in (str(batch), "%d.0" % batch):
        raise SimulationError("%s: %s: batch must be a whole number > 0, not %r"
                              % (path, where, value))
    return batch


def _from_json(text, path):
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SimulationError("%s: not valid JSON (%s)" % (path, str(exc).splitlines()[0]
                                                          if str(exc) else "too deep")) from None
    return _from_doc(doc, path)


def _from_doc(doc, path):
    batch = None
    if isinstance(doc, dict):
        if "batch" in doc:
            batch = _batch_value(doc["batch"], path, "batch")
        doc = doc.get("layers")
    if not isinstance(doc, list) or not doc:
        raise SimulationError("%s: expected {\"layers\": [{\"name\", \"forward_ms\", "
                              "\"backward_ms\"}, ...]} with at least one layer" % path)
    rows = []
    for k, entry in enumerate(doc):
        where = "layers[%d]" % k
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise SimulationError("%s: %s: expected an object with a name, forward_ms and "
                                  "backward_ms" % (path, where))
        for key in ("forward_ms", "backward_ms"):
            if key not in entry:
                raise SimulationError("%s: %s (%s) has no %s" % (path, where, entry["name"], key))
        rows.append((entry["name"], _number(entry["forward_ms"], path, where + " forward_ms"),
                     _number(entry["backward_ms"], path, where + " backward_ms"), where))
    return rows, batch


def _from_time_log(text, path):
    found = {}
    order = []
    for number, line in enumerate(text.splitlines(), 1):
        match = _TIME_LINE.search(line)
        if not match:
            continue
        name, kind, value = match.groups()
        if name not in found:
            found[name] = [None, None, "line %d" % number]
            order.append(name)
        found[name][0 if kind == "forward" else 1] = _number(value, path, "line %d" % number)
    rows = []
    for name in order:
        fwd, bwd, where = found[name]
        if fwd is None or bwd is None:
            raise SimulationError("%s: %s: layer %s has a %s time but no %s time"
                                  % (path, where, name, "forward" if bwd is None else "backward",
                                     "backward" if bwd is None else "forward"))
        rows.append((name, fwd, bwd, where))
    return rows, None


def _bench_report(text):
    """bench_gpu's report as a dict when ``text`` is one (a JSON object with "nets"), else
    None."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and "nets" in doc else None


def _from_bench_report(doc, path, model):
    """(rows, batch, note) of the net of bench_gpu's report whose layers are ``model``'s."""
    nets = doc["nets"]
    if not isinstance(nets, dict) or not nets:
        raise SimulationError("%s: a bench_gpu report without nets (expected \"nets\": "
                              "{name: {\"batch\", \"layers\"}})" % path)
    wanted = {n for n, t in zip(model.layer_names, model.layer_types) if t != "Split"}
    known = set(model.layer_names)
    fits = []
    for name, row in nets.items():
        if not isinstance(row, dict):
            raise SimulationError("%s: nets.%s is not an object" % (path, name))
        rows, batch = _from_doc(row, "%s (net %s)" % (path, name))
        names = {r[0] for r in rows}
        if names <= known and wanted <= names:
            fits.append((name, rows, batch))
    if len(fits) != 1:
        raise SimulationError("%s: a bench_gpu report of net%s %s, %s the layers of net %s"
                              % (path, "" if len(nets) == 1 else "s", ", ".join(nets),
                                 "none of them with" if not fits else "several with",
                                 model.name or model.source))
    name, rows, batch = fits[0]
    note = "per-layer times of %s from bench_gpu on %s" % (name, doc.get("device", "a GPU"))
    if doc.get("emulated"):
        note += " (the emulated device: host times, not GPU times)"
    return rows, batch, note


def parse_compute_text(text, path):
    """[(layer, forward_ms, backward_ms, where)], batch or None, from a file's text."""
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        return _from_json(text, path)
    if "\tforward: " in text or "\tbackward: " in text:
        rows, batch = _from_time_log(text, path)
        if rows:
            return rows, batch
    return _from_csv(text, path)


def read_compute_file(path, model):
    """LayerTimes for ``model`` (a NetModel) from the compute file at ``path``."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise SimulationError("-compute=%s cannot be read: %s" % (path, exc.strerror or exc)) \
            from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SimulationError("%s: not a text file (expected CSV, JSON or a time log)" % path) \
            from None
    report = _bench_report(text)
    if report is not None:
        rows, batch, note = _from_bench_report(report, path, model)
        return match_layers(rows, batch, model, path, note)
    rows, batch = parse_compute_text(text, path)
    return match_layers(rows, batch, model, path)


def match_layers(rows, batch, model, path, note=""):
    index = {name: i for i, name in enumerate(model.layer_names)}
    forward = [None] * len(model.layer_names)
    backward = [None] * len(model.layer_names)
    for name, fwd, bwd, where in rows:
        if name not in index:
            raise SimulationError("%s: %s names layer %r, which net %s does not have (its "
                                  "layers: %s)" % (path, where, name, model.name or model.source,
                                                   _some(model.layer_names)))
        i = index[name]
        if forward[i] is not None:
            raise SimulationError("%s: %s gives layer %s a second time" % (path, where, name))
        forward[i], backward[i] = fwd, bwd
    missing = [name for i, name in enumerate(model.layer_names)
               if forward[i] is None and model.layer_types[i] != "Split"]
    if missing:
        raise SimulationError("%s: no times for %d layer(s) of net %s: %s"
                              % (path, len(missing), model.name or model.source, _some(missing)))
    forward = [v or 0.0 for v in forward]
    backward = [v or 0.0 for v in backward]
    times = LayerTimes(forward, backward, source="read from %s" % path, note=note)
    if batch is not None and batch != model.batch:
        times = times.scaled(model.batch / float(batch))
        times.note = "; ".join(part for part in (note, "times taken at batch %d, scaled to the "
                                                 "net's batch %d" % (batch, model.batch)) if part)
    return times


def _some(names, limit=8):
    shown = ", ".join(names[:limit])
    return shown + (", ... (%d in all)" % len(names) if len(names) > limit else "")


def fill_inputs(net):
    """Random data in the Input layers' tops, 0 in those that are labels: a second top of an
    Input layer, or a blob some layer takes as a second or later bottom (a loss's target)."""
    import numpy as np
    rng = np.random.default_rng(0)
    targets = set()
    for i in range(len(net.layers)):
        bottoms, _ = net.layer_blobs(i)
        targets.update(id(blob) for blob in bottoms[1:])
    for i, kind in enumerate(layer.param.type for layer in net.layers):
        if kind != "Input":
            continue
        _, tops = net.layer_blobs(i)
        for k, top in enumerate(tops):
            label = k > 0 or id(top) in targets
            top.data[...] = 0 if label else rng.standard_normal(top.shape)


def measure(net, iterations=10, warmup=1, on_step=None):
    """LayerTimes of ``net`` on this machine's CPU: the timing ``time`` does, mean of
    ``iterations`` passes after ``warmup`` untimed ones. The net's input tops get random
    data (labels 0) so that every layer runs as in training. ``on_step(done, total)`` is
    called after each layer's forward and each layer's backward of every pass (a large net
    takes minutes here)."""
    from ..net.timing import time_layers
    fill_inputs(net)
    warmup = max(warmup, 0)
    total = 2 * len(net.layers) * (warmup + iterations)
    done = [0]

    def step():
        done[0] += 1
        on_step(done[0], total)
    on_layer = step if on_step is not None else None
    if on_step is not None:
        on_step(0, total)
    if warmup:
        time_layers(net, warmup, on_layer=on_layer)
    times = time_layers(net, iterations, on_layer=on_layer)
    per = 1e3 / max(iterations, 1)
    return LayerTimes([v * per for v in times["forward"]], [v * per for v in times["backward"]],
                      source="measured on this CPU (mean of %d pass%s after %d untimed): each "
                      "worker is taken to be as fast as this CPU, not a GPU"
                      % (iterations, "" if iterations == 1 else "es", warmup))


# -- one per-iteration figure spread over the layers ---------------------------------------------
def layer_work(net):
    """Multiply-adds of each layer's forward (and backward, twice that for layers with
    weights: the input gradient and the weight gradient), from the shapes: convolutions and
    inner products by their weights, every other layer one per output value."""
    forward, backward = [], []
    for i, layer in enumerate(net.layers):
        bottoms, tops = net.layer_blobs(i)
        kind = layer.param.type
        out = sum(t.count for t in tops)
        weights = layer.blobs[0] if layer.blobs else None
        if kind == "Convolution" and weights is not None:
            work = tops[0].count * weights.count / float(weights.shape[0])
        elif kind == "Deconvolution" and weights is not None:
            work = bottoms[0].count * weights.count / float(weights.shape[0])
        elif kind == "InnerProduct" and weights is not None:
            n = layer.param.inner_product_param.num_output
            work = weights.count * (tops[0].count / float(n))
        else:
            work = float(out)
            forward.append(work)
            backward.append(work)
            continue
        forward.append(work)
        backward.append(2.0 * work)
    return forward, backward


def spread_total(net, total_ms, source):
    """LayerTimes whose sum is ``total_ms``, shared out in proportion to ``layer_work``."""
    forward, backward = layer_work(net)
    whole = sum(forward) + sum(backward)
    if whole <= 0:
        raise SimulationError("%s: the net does no work to share %g ms over" % (source, total_ms))
    scale = total_ms / whole
    return LayerTimes([w * scale for w in forward], [w * scale for w in backward],
                      source="given as total=%g ms per iteration, spread over the layers by "
                      "multiply-adds" % total_ms)


def measure_update_rate(values=1 << 22, repeats=3):
    """Parameter values per second this machine updates the way the sync engine does after an
    exchange: the gradient copied out, the sum averaged, weight decay, SGD with momentum
    (``solver.updates``), the weights moved. The best of ``repeats``."""
    import time
    import numpy as np
    from ..solver import updates
    data = np.ones(values, np.float32)
    diff = np.full(values, 1e-3, np.float32)
    history = [np.zeros(values, np.float32)]
    best = None
    for _ in range(repeats):
        start = time.perf_counter()
        total = np.array(diff, copy=True)
        total *= 0.5
        updates.regularize(data, total, 5e-4)
        updates.sgd(total, history[0], 0.01, 0.9)
        data -= total
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return values / max(best, 1e-9)
