"""Write poseidon_caffe/backend/cuda/kernels/<module>.py for every kernels/<module>.cu: its
kernels as named Kernel objects, read from the source's KERNEL declarations. Run after adding
or changing a kernel; tests/test_cuda_build.py fails while a module differs from its source.

    python scripts/kernel_stubs.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from poseidon_caffe.backend.cuda import build, launch  # noqa: E402


def main():
    for module, source in build.sources().items():
        path = os.path.splitext(source)[0] + ".py"
        text = launch.stub_text(module)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
