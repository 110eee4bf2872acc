"""scripts/run_bvlc_pycaffe_tests.py on a stand-in checkout: a python/caffe/test folder with
two small test files written here (one passing, one failing), and a real-looking compiled
pycaffe in python/caffe that must not be the one imported."""
import os
import subprocess
import sys

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "run_bvlc_pycaffe_tests.py")

PASSING = """
import os
import unittest
import caffe
import poseidon_caffe


class TestAlias(unittest.TestCase):
    def test_caffe_is_this_project(self):
        self.assertIs(caffe, poseidon_caffe)
        self.assertIn('Python', caffe.layer_type_list())

    def test_runs_in_a_scratch_folder(self):
        self.assertNotIn('python', os.getcwd().split(os.sep)[-3:])
"""

FAILING = """
import unittest
import caffe


class TestMissing(unittest.TestCase):
    def test_missing(self):
        caffe.no_such_function()
"""


def make_checkout(tmp_path):
    tests = tmp_path / "caffe" / "python" / "caffe" / "test"
    tests.mkdir(parents=True)
    (tmp_path / "caffe" / "python" / "caffe" / "__init__.py").write_text(
        "from ._caffe import Net\n")
    (tests / "test_alias_ok.py").write_text(PASSING)
    (tests / "test_alias_bad.py").write_text(FAILING)
    return tmp_path / "caffe"


def run(args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([PY, SCRIPT] + args, capture_output=True, text=True, env=env,
                          timeout=180)


def test_runner_reports_each_file_and_fails_when_one_fails(tmp_path):
    checkout = make_checkout(tmp_path)
    proc = run([str(checkout)])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(l.startswith("test_alias_ok.py") and " PASS " in l for l in lines)
    assert any(l.startswith("test_alias_bad.py") and " FAIL " in l for l in lines)
    assert lines[-1] == "1 of 2 files passed; failed: test_alias_bad.py"


def test_runner_rejects_an_unknown_test_name(tmp_path):
    checkout = make_checkout(tmp_path)
    proc = run([str(checkout), "--only", "test_nothing.py"])
    assert proc.returncode == 2 and "not in " in proc.stderr and "test_nothing.py" in proc.stderr


def test_runner_names_a_folder_that_is_no_checkout(tmp_path):
    proc = run([str(tmp_path)])
    assert proc.returncode == 2
    assert "has no python/caffe/test folder" in proc.stderr
