"""poseidon_caffe.draw and `poseidon-caffe draw_net`: the graph's nodes and edges read back from
the DOT text, phases filtered by include/exclude rules, PNG and SVG rendered by graphviz itself,
and DOT written without graphviz on PATH."""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

pydot = pytest.importorskip("pydot")

from poseidon_caffe import draw  # noqa: E402
from poseidon_caffe.io import parse_net_text  # noqa: E402
from poseidon_caffe.proto import caffe_pb2  # noqa: E402

NET = """
name: "small"
layer { name: "train_data" type: "Data" top: "data" top: "label" include { phase: TRAIN }
  data_param { source: "train_lmdb" batch_size: 64 } }
layer { name: "test_data" type: "Data" top: "data" top: "label" include { phase: TEST }
  data_param { source: "test_lmdb" batch_size: 100 } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 } param { lr_mult: 2 }
  convolution_param { num_output: 20 kernel_size: 5 stride: 2 pad: 1 } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 10 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss"
  exclude { phase: TEST } }
layer { name: "accuracy" type: "Accuracy" bottom: "ip1" bottom: "label" top: "accuracy"
  include { phase: TEST } }
layer { name: "stats" type: "Silence" bottom: "ip1" include { stage: "debug" } }
"""

NODE = re.compile(r'^"([^"]+)" \[(.*)\];$')
EDGE = re.compile(r'^"([^"]+)" -> "([^"]+)" \[label="?([^"\]]*)"?\];$')


def read_dot(text):
    """{node id: attribute text}, [(src, dst, label)] from the DOT text, line by line."""
    nodes, edges = {}, []
    for line in text.splitlines():
        line = line.strip()
        edge = EDGE.match(line)
        if edge:
            edges.append(edge.groups())
            continue
        node = NODE.match(line)
        if node:
            nodes[node.group(1)] = node.group(2)
    return nodes, edges


def layer_names(nodes):
    return {key.split(" ")[1] for key in nodes if key.startswith("layer ")}


def dot_of(phase=None, rankdir="LR", display_lrm=False):
    return draw.draw_net(parse_net_text(NET), rankdir, "dot", phase, display_lrm).decode()


def test_edges_run_from_bottoms_through_layers_to_tops():
    nodes, edges = read_dot(dot_of(caffe_pb2.TRAIN))
    assert layer_names(nodes) == {"train_data", "conv1", "relu1", "pool1", "ip1", "loss",
                                  "stats"}
    expected = {
        ("layer train_data Data", "blob data", "Batch 64"),
        ("layer train_data Data", "blob label", "Batch 64"),
        ("blob data", "layer conv1 Convolution", ""),
        ("layer conv1 Convolution", "blob conv1", "20"),
        ("blob conv1", "layer relu1 ReLU", ""),
        ("layer relu1 ReLU", "blob conv1", ""),
        ("blob conv1", "layer pool1 Pooling", ""),
        ("layer pool1 Pooling", "blob pool1", ""),
        ("blob pool1", "layer ip1 InnerProduct", ""),
        ("layer ip1 InnerProduct", "blob ip1", "10"),
        ("blob ip1", "layer loss SoftmaxWithLoss", ""),
        ("blob label", "layer loss SoftmaxWithLoss", ""),
        ("layer loss SoftmaxWithLoss", "blob loss", ""),
        ("blob ip1", "layer stats Silence", ""),
    }
    assert set(edges) == expected
    assert len(edges) == len(expected)
    blobs = {key for key in nodes if key.startswith("blob ")}
    assert blobs == {"blob data", "blob label", "blob conv1", "blob pool1", "blob ip1",
                     "blob loss"}
    for blob in blobs:
        assert "shape=octagon" in nodes[blob]


def test_layer_labels_colours_and_learning_rate_multipliers():
    nodes, _ = read_dot(dot_of(caffe_pb2.TRAIN, display_lrm=True))
    conv = nodes["layer conv1 Convolution"]
    assert r'label="conv1\n(Convolution)\nkernel size: 5\nstride: 2\npad: 1\nlr mult: 1.0, 2.0"' \
        in conv
    assert 'fillcolor="#FF5050"' in conv
    pool = nodes["layer pool1 Pooling"]
    assert r'label="pool1\n(Pooling AVE)\nkernel size: 3\nstride: 2\npad: 0"' in pool
    assert 'fillcolor="#FF9900"' in pool
    # an in-place layer is a neuron layer: green
    assert 'fillcolor="#90EE90"' in nodes["layer relu1 ReLU"]
    assert 'lr mult: 1.0, 1.0' in nodes["layer ip1 InnerProduct"]
    # top to bottom: one line per label
    nodes, _ = read_dot(dot_of(caffe_pb2.TRAIN, rankdir="TB"))
    assert 'label="conv1 (Convolution) kernel size: 5 stride: 2 pad: 1"' in \
        nodes["layer conv1 Convolution"]


def test_phase_selects_layers_by_include_and_exclude_rules():
    everything = {"train_data", "test_data", "conv1", "relu1", "pool1", "ip1", "loss",
                  "accuracy", "stats"}
    assert layer_names(read_dot(dot_of(None))[0]) == everything
    assert layer_names(read_dot(dot_of(caffe_pb2.TEST))[0]) == \
        everything - {"train_data", "loss"}
    assert layer_names(read_dot(dot_of(caffe_pb2.TRAIN))[0]) == \
        everything - {"test_data", "accuracy"}


def test_include_and_exclude_together_is_an_error_naming_the_layer():
    net = parse_net_text('layer { name: "odd" type: "ReLU" bottom: "x" top: "x" '
                         'include { phase: TRAIN } exclude { phase: TEST } }')
    with pytest.raises(ValueError, match="layer odd has both include and exclude"):
        draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TRAIN)


def test_learning_rate_multipliers_of_learning_layers_only():
    net = parse_net_text(NET)
    by_name = {layer.name: layer for layer in net.layer}
    assert draw.get_layer_lr_mult(by_name["conv1"]) == (1.0, 2.0)
    assert draw.get_layer_lr_mult(by_name["ip1"]) == (1.0, 1.0)
    with pytest.raises(ValueError, match="Pooling layers do not have"):
        draw.get_layer_lr_mult(by_name["pool1"])
    assert draw.get_pooling_types_dict()[caffe_pb2.PoolingParameter.MAX] == "MAX"
    assert draw.get_edge_label(by_name["relu1"]) == '""'


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")


@needs_dot
def test_png_is_rendered_by_graphviz_and_follows_rankdir():
    PIL = pytest.importorskip("PIL.Image")
    import io
    wide = PIL.open(io.BytesIO(draw.draw_net(parse_net_text(NET), "LR", "png")))
    tall = PIL.open(io.BytesIO(draw.draw_net(parse_net_text(NET), "TB", "png")))
    assert wide.format == tall.format == "PNG"
    assert wide.size[0] > wide.size[1]
    assert tall.size[1] > tall.size[0]


@needs_dot
def test_graphviz_lays_out_every_node_and_edge():
    # dot's plain output lists what it laid out: one node line per layer and blob
    net = parse_net_text(NET)
    plain = draw.draw_net(net, "LR", "plain", caffe_pb2.TEST).decode()
    kinds = [line.split(" ")[0] for line in plain.splitlines()]
    assert kinds.count("node") == 7 + 6     # layers of TEST + blobs (no loss blob)
    assert kinds.count("edge") == 14


@needs_dot
def test_svg_names_every_layer(tmp_path):
    out = tmp_path / "net.svg"
    draw.draw_net_to_file(parse_net_text(NET), str(out), "LR", caffe_pb2.TEST)
    root = ET.parse(str(out)).getroot()
    texts = {el.text for el in root.iter() if el.tag.endswith("text")}
    for name in ("test_data", "conv1", "relu1", "pool1", "ip1", "accuracy", "(Pooling AVE)"):
        assert name in texts
    assert "train_data" not in texts


def run_cli(tmp_path, *args, path=None):
    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run([sys.executable, "-m", "poseidon_caffe.cli", "draw_net"] + list(args),
                          cwd=str(tmp_path), capture_output=True, text=True, env=env,
                          timeout=120)
    return proc.returncode, proc.stderr


def test_cli_writes_dot_without_graphviz_and_names_graphviz_for_png(tmp_path):
    (tmp_path / "net.prototxt").write_text(NET)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    code, err = run_cli(tmp_path, "net.prototxt", "net.dot", "--phase", "TEST", "--rankdir",
                        "TB", path=str(empty_bin))
    assert code == 0, err
    nodes, _ = read_dot((tmp_path / "net.dot").read_text())
    assert "layer accuracy Accuracy" in nodes and "layer loss SoftmaxWithLoss" not in nodes
    assert "rankdir=TB" in (tmp_path / "net.dot").read_text()
    code, err = run_cli(tmp_path, "net.prototxt", "net.png", path=str(empty_bin))
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("E")]
    assert len(errors) == 1
    assert "install graphviz" in errors[0] and "'dot'" in errors[0]
    assert not (tmp_path / "net.png").exists()


@needs_dot
def test_cli_renders_legacy_nets_and_refuses_bad_input(tmp_path):
    # a V1 net (layers, enum types) is upgraded before drawing
    (tmp_path / "v1.prototxt").write_text(
        'name: "old" layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" '
        'inner_product_param { num_output: 7 } }')
    code, err = run_cli(tmp_path, "v1.prototxt", "v1.svg")
    assert code == 0, err
    svg = (tmp_path / "v1.svg").read_text()
    assert "(InnerProduct)" in svg and ">7<" in svg
    code, err = run_cli(tmp_path, "missing.prototxt", "x.png")
    assert code == 1 and "missing.prototxt" in err and "Traceback" not in err
    code, err = run_cli(tmp_path, "v1.prototxt", "x.png", "-phase", "VAL")
    assert code == 1 and "-phase takes TRAIN, TEST or ALL" in err
    code, err = run_cli(tmp_path, "v1.prototxt", "x.nosuchformat")
    assert code == 1 and "nosuchformat" in err and "Traceback" not in err
    assert not (tmp_path / "x.nosuchformat").exists()
