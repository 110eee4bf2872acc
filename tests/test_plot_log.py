"""`poseidon-caffe plot`: several logs in one picture of the size asked for, each log's curves
in its own colour, and clear errors for what cannot be plotted."""
import numpy as np
import pytest

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

from poseidon_caffe import cli, plot_log  # noqa: E402
from poseidon_caffe.tools.plot_log import plot_main  # noqa: E402
from test_training_log import caffe_log, errors_of, train_log  # noqa: E402

FIRST_LOG_RGB = (0x1F, 0x77, 0xB4)      # the palette's first two colours
SECOND_LOG_RGB = (0xD6, 0x27, 0x28)


def pixels_of(image, rgb):
    array = np.asarray(image.convert("RGB")).astype(int)
    return int((np.abs(array - np.array(rgb)).sum(axis=2) <= 6).sum())


def test_two_logs_in_one_picture_of_the_asked_size(tmp_path):
    project = train_log(tmp_path)
    caffe = caffe_log(tmp_path)
    out = tmp_path / "curves.png"
    code, errors = errors_of(cli.main, ["plot", str(project), str(caffe), "-o", str(out),
                                        "--size", "900x700"])
    assert code == 0, errors
    image = Image.open(out)
    image.load()
    assert image.format == "PNG" and image.size == (900, 700)
    assert pixels_of(image, FIRST_LOG_RGB) > 200
    assert pixels_of(image, SECOND_LOG_RGB) > 200


def test_one_log_draws_one_colour_and_svg_is_written(tmp_path):
    caffe = caffe_log(tmp_path)
    assert plot_log.plot_logs([str(caffe)], str(tmp_path / "one.png"), 600, 500) == \
        ["loss", "accuracy", "learning rate"]
    image = Image.open(tmp_path / "one.png")
    assert image.size == (600, 500)
    assert pixels_of(image, FIRST_LOG_RGB) > 100
    assert pixels_of(image, SECOND_LOG_RGB) == 0
    plot_log.plot_logs([str(caffe)], str(tmp_path / "one.svg"))
    assert (tmp_path / "one.svg").read_text().lstrip().startswith("<?xml")


def test_what_cannot_be_plotted_is_one_clear_line(tmp_path):
    caffe = caffe_log(tmp_path)
    (tmp_path / "quiet.log").write_text("I0101 00:00:01.000000 1 solver.cpp:279] Solving X\n")
    for argv, message in (([str(caffe), "-o", str(tmp_path / "c.jpg")], ".png, .svg or .pdf"),
                          ([str(tmp_path / "quiet.log")], "holds no 'Train net output'"),
                          ([str(caffe), "-size", "big"], "-size takes WIDTHxHEIGHT"),
                          ([], "at least one LOGFILE")):
        code, errors = errors_of(plot_main, argv)
        assert code == 1 and len(errors) == 1 and message in errors[0], errors
    assert not list(tmp_path.glob("c.*")) and not (tmp_path / "curves.png").exists()
