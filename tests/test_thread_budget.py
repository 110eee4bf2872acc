"""Ranks that share a host share its cores: BLAS gets cores / local ranks threads."""
import os
import subprocess
import sys

from poseidon_caffe import thread_budget


def test_share_follows_the_local_rank_count():
    env = {"MPI_LOCALNRANKS": "2"}
    assert thread_budget.apply(env, cores=8) == 4
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == "4"
    env = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}
    assert thread_budget.apply(env, cores=2) == 1
    assert env["MKL_NUM_THREADS"] == "1"


def test_a_single_process_or_a_users_choice_is_left_alone():
    env = {}
    assert thread_budget.apply(env, cores=8) is None and env == {}
    env = {"MPI_LOCALNRANKS": "2", "OMP_NUM_THREADS": "3"}
    assert thread_budget.apply(env, cores=8) is None
    assert "OPENBLAS_NUM_THREADS" not in env


def test_importing_the_package_sets_the_budget_before_numpy_loads():
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["MPI_LOCALNRANKS"] = "64"
    code = ("import sys, os; import poseidon_caffe; "
            "print(os.environ['OPENBLAS_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "1"
