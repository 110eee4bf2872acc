"""The simulator in the Poseidon paper's setting (Zhang et al., USENIX ATC 2017): one Titan X
per node, 40 GbE, the paper's batch sizes, single-GPU iteration times spread over the layers by
their multiply-adds; predicted speedups at 2-32 nodes beside the paper's, as a markdown table,
and the plot docs/simulation_paper.png. docs/SIMULATION.md says where every input comes from.

    python scripts/simulate_paper.py [--plot docs/simulation_paper.png] [--json rows.json]
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NODES = [1, 2, 4, 8, 16, 32]
GOOGLENET_MS, GOOGLENET_BATCH = 450.6, 128

# name, prototxt, batch per GPU, single-GPU ms per iteration (None: from GoogLeNet's ms per
# multiply-add), the paper's speedups {nodes: x} for Poseidon and what they are
NETS = [
    ("AlexNet", "examples/alexnet/train_val.prototxt", 256, 2 * 90.1,
     {8: 4.5}, "2015 preprint, 8 K20 nodes"),
    ("GoogLeNet", "examples/googlenet/train_val.prototxt", GOOGLENET_BATCH, GOOGLENET_MS,
     {}, "no figure found"),
    ("Inception-V3", "examples/simulation/inception_v3.prototxt", 32, None,
     {32: 31.5}, "TensorFlow engine"),
    ("VGG19-22K", "examples/simulation/vgg19_22k.prototxt", 32, 925.0,
     {2: 2 * 18.5 / 18.9, 4: 4 * 18.5 / 19.3, 8: 8 * 18.5 / 19.4, 16: 16 * 18.5 / 19.7,
      32: 32 * 18.5 / 20.1}, "Caffe engine"),
]
# the paper's VGG19-22K baselines (Caffe engine, 40 GbE): Caffe with the PS alone, and with WFBP
BASELINES = {"Caffe+WFBP": ("ps", True, [18.5, 20.8, 22.58, 24.2, 25.6, 27.7]),
             "Caffe+PS": ("ps", False, [18.5, 36.8, 50.3, 68.5, 105, 134])}


def work(net):
    from poseidon_caffe.simulator.compute import layer_work
    forward, backward = layer_work(net)
    return sum(forward)


def predict_all(bandwidth="40gbit", latency="50us"):
    from poseidon_caffe import simulator
    from poseidon_caffe.simulator import model as net_models
    from poseidon_caffe.simulator import report
    g_model, g_net = net_models.load(os.path.join(ROOT, NETS[1][1]), batch=GOOGLENET_BATCH)
    ms_per_mac = GOOGLENET_MS / (3 * work(g_net))        # forward + backward (2x)
    cluster = simulator.Cluster(1, simulator.parse_rate(bandwidth),
                                latency=simulator.parse_delay(latency))
    out = {}
    for name, path, batch, ms, paper, what in NETS:
        model, net = net_models.load(os.path.join(ROOT, path), batch=batch)
        if ms is None:
            ms = ms_per_mac * 3 * work(net)
        times = simulator.spread_total(net, ms, path)
        runs = {"Poseidon": ("auto", True)}
        if name == "VGG19-22K":
            runs.update({k: v[:2] for k, v in BASELINES.items()})
        for label, (mode, dwbp) in runs.items():
            predictions, baseline = simulator.predict(model, times, NODES, cluster, mode,
                                                      None, dwbp)
            out[(name, label)] = {"ms": ms, "batch": batch, "params": model.param_bytes / 4,
                                  "rows": report.rows(predictions, baseline)}
    return out


def paper_speedups(name, label):
    if label == "Poseidon":
        return dict(next(n for n in NETS if n[0] == name)[4])
    times = BASELINES[label][2]
    return {n: n * times[0] / t for n, t in zip(NODES, times)}


def table(results):
    lines = ["| net | schedule | 1-GPU ms/iter | 8 nodes: ours / paper | 16 nodes | 32 nodes |",
             "|---|---|---|---|---|---|"]
    for (name, label), r in results.items():
        paper = paper_speedups(name, label)
        cells = []
        for n in (8, 16, 32):
            ours = next(row["speedup"] for row in r["rows"] if row["nodes"] == n)
            cells.append("%.1f / %s" % (ours, "%.1f" % paper[n] if n in paper else "-"))
        lines.append("| %s | %s | %.0f (batch %d) | %s |" % (name, label, r["ms"], r["batch"],
                                                            " | ".join(cells)))
    return "\n".join(lines)


def plot(results, path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=(9.0, 3.8), dpi=90)
    FigureCanvasAgg(figure)
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    for ax, keys, title in ((left, [k for k in results if k[1] == "Poseidon"],
                             "Poseidon schedule, 40 GbE"),
                            (right, [k for k in results if k[0] == "VGG19-22K"],
                             "VGG19-22K, 40 GbE: three schedules")):
        for key in keys:
            rows = results[key]["rows"]
            label = key[0] if ax is left else key[1]
            line, = ax.plot([r["nodes"] for r in rows], [r["speedup"] for r in rows],
                            marker="o", markersize=4, label=label + " (ours)")
            paper = paper_speedups(*key)
            if paper:
                ax.plot(list(paper), list(paper.values()), linestyle="none", marker="s",
                        markerfacecolor="none", color=line.get_color(), label=label + " (paper)")
        ax.plot([1, 32], [1, 32], color="grey", linestyle=":", linewidth=1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("nodes (1 GPU each)", fontsize=9)
        ax.set_ylabel("speedup over one node", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, format="png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "simulation_paper.png"))
    parser.add_argument("--json", default="")
    parser.add_argument("--bandwidth", default="40gbit")
    a = parser.parse_args()
    import logging
    from poseidon_caffe import log
    log.set_console_level(logging.WARNING)
    results = predict_all(a.bandwidth)
    print(table(results))
    if a.plot:
        plot(results, a.plot)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"%s/%s" % k: v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
