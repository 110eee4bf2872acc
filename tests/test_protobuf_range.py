"""The protobuf range the package declares (setup.cfg: protobuf>=4.25,<8), at its ends: the
suite itself runs under the newest protobuf pip gives, and here the proto and io tests run
again in a process whose protobuf is the lowest, 4.25, installed beside the suite's (pip
--target, first on PYTHONPATH), so the generated caffe_pb2 and every reader and writer are
shown to work with what PyTorch, TensorFlow or ONNX keep installed."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOWEST = "protobuf==4.25.9"
CHECKED = ["tests/test_proto_schema.py", "tests/test_io.py"]


@pytest.fixture(scope="module")
def lowest_protobuf(tmp_path_factory):
    target = str(tmp_path_factory.mktemp("protobuf-lowest"))
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "--only-binary=:all:", "--disable-pip-version-check", "--target",
                          target, LOWEST], capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        pytest.skip("pip could not install %s: %s" % (LOWEST, run.stderr.strip()[-300:]))
    return target


def test_the_proto_and_io_tests_pass_under_the_lowest_protobuf(lowest_protobuf, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [lowest_protobuf, ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    version = subprocess.run([sys.executable, "-c", "import google.protobuf as p; "
                              "print(p.__version__)"], env=env, capture_output=True,
                             text=True)
    assert version.stdout.strip() == LOWEST.split("==")[1], version.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-m", "not mpi"] + CHECKED, cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " failed" not in run.stdout
