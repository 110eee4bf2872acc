"""poseidon-caffe: a Caffe-compatible trainer. Import it as pycaffe: ``import poseidon_caffe as caffe``."""
__version__ = "0.1.0"
