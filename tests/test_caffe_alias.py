"""`poseidon-caffe alias`: `import caffe` loads this package, opt-in, never over a real Caffe.

Each check runs a fresh interpreter with a throwaway target directory on its path, so the
import system is exercised exactly as a user's script meets it.
"""
import os
import subprocess
import sys
import sysconfig

import pytest

from poseidon_caffe import caffe_alias

PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, path_entries, cwd=None, python=PY):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path_entries), POSEIDON_NO_PROGRESS="1")
    return subprocess.run([python] + args, capture_output=True, text=True, env=env,
                          timeout=60, cwd=cwd)


def alias_cmd(action, target, path_entries, python=PY):
    args = ["-m", "poseidon_caffe.cli", "alias", action]
    if target:
        args += ["--target", str(target)]
    return run(args, path_entries, python=python)


IDENTITY_CHECK = """
import caffe, poseidon_caffe
import caffe.io
from caffe.proto import caffe_pb2
from caffe import layers as L, params as P
import caffe.solver.solvers
assert caffe is poseidon_caffe
assert caffe.io is poseidon_caffe.io
assert caffe_pb2 is poseidon_caffe.proto.caffe_pb2
assert caffe.solver.solvers is poseidon_caffe.solver.solvers
assert caffe.io.__spec__.name == "poseidon_caffe.io"
assert L is poseidon_caffe.layers and P is poseidon_caffe.params
print("same modules")
"""


def test_install_makes_import_caffe_this_package_and_remove_undoes_it(tmp_path):
    target = tmp_path / "site"
    target.mkdir()
    path = [ROOT, str(target)]
    before = run(["-c", "import caffe"], path)
    assert before.returncode != 0 and "No module named 'caffe'" in before.stderr

    proc = alias_cmd("install", target, path)
    assert proc.returncode == 0, proc.stderr
    with open(target / "caffe" / "__init__.py") as f:
        assert f.readline().rstrip("\n") == caffe_alias.MARKER

    proc = run(["-c", IDENTITY_CHECK], path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "same modules"

    status = alias_cmd("status", target, path)
    assert "alias: %s" % (target / "caffe") in status.stdout
    assert "real Caffe: none importable" in status.stdout

    proc = alias_cmd("remove", target, path)
    assert proc.returncode == 0 and not (target / "caffe").exists()
    assert run(["-c", "import caffe"], path).returncode != 0
    # removing again is harmless and says so
    proc = alias_cmd("remove", target, path)
    assert proc.returncode == 0 and "no alias installed" in proc.stdout


def test_install_refuses_where_a_real_caffe_is_importable(tmp_path):
    target = tmp_path / "site"
    target.mkdir()
    real = tmp_path / "bvlc_python" / "caffe"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("from ._caffe import Net\n")
    path = [ROOT, str(real.parent), str(target)]
    proc = alias_cmd("install", target, path)
    assert proc.returncode == 1
    assert "a real Caffe is importable here (%s)" % real in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (target / "caffe").exists()
    status = alias_cmd("status", target, path)
    assert "real Caffe: %s" % real in status.stdout and "alias: not installed" in status.stdout


def test_a_compiled_caffe_module_counts_as_real(tmp_path):
    (tmp_path / "caffe.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    (tmp_path / "site").mkdir()
    with pytest.raises(caffe_alias.AliasError, match="real Caffe"):
        caffe_alias.install(str(tmp_path / "site"), search_path=[str(tmp_path)])


def test_remove_leaves_a_caffe_it_did_not_write(tmp_path):
    other = tmp_path / "caffe"
    other.mkdir()
    (other / "__init__.py").write_text("# somebody's own package\n")
    proc = alias_cmd("remove", tmp_path, [ROOT])
    assert proc.returncode == 1
    assert "is not the poseidon-caffe alias" in proc.stderr
    assert (other / "__init__.py").read_text() == "# somebody's own package\n"


def test_installing_twice_keeps_one_alias(tmp_path):
    caffe_alias.install(str(tmp_path), search_path=[])
    caffe_alias.install(str(tmp_path), search_path=[str(tmp_path)])
    assert sorted(os.listdir(tmp_path / "caffe")) == ["__init__.py"]
    assert caffe_alias.status(str(tmp_path), search_path=[]) == (str(tmp_path / "caffe"), [])


def test_default_target_is_the_active_environments_site_packages(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([PY, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    venv_python = str(venv / "bin" / "python")
    venv_site = subprocess.run([venv_python, "-c", "import sysconfig; "
                                "print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip()
    # the venv sees this checkout and the packages it needs, as an installed project would
    path = [ROOT, sysconfig.get_paths()["purelib"]]
    proc = alias_cmd("install", None, path, python=venv_python)
    assert proc.returncode == 0, proc.stderr
    assert os.path.isfile(os.path.join(venv_site, "caffe", "__init__.py"))
    proc = run(["-c", "import caffe, poseidon_caffe; print(caffe is poseidon_caffe)"], path,
               python=venv_python)
    assert proc.stdout.strip() == "True", proc.stderr
    # the interpreter running these tests is untouched
    assert run(["-c", "import caffe"], [ROOT]).returncode != 0


def test_install_makes_a_new_target_folder_and_says_to_put_it_on_the_path(tmp_path):
    target = tmp_path / "new" / "alias"
    proc = alias_cmd("install", target, [ROOT])
    assert proc.returncode == 0, proc.stderr
    assert "put %s on PYTHONPATH" % target in proc.stdout
    proc = run(["-c", "import caffe, poseidon_caffe; print(caffe is poseidon_caffe)"],
               [ROOT, str(target)])
    assert proc.stdout.strip() == "True", proc.stderr
    # a target that is a file is one clear line, not a traceback
    afile = tmp_path / "afile"
    afile.write_text("x")
    proc = alias_cmd("install", afile, [ROOT])
    assert proc.returncode == 1 and "is not a directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
