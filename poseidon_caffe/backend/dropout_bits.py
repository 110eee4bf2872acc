"""Dropout's draws, one definition for every backend: a counter hash of a key the layer draws
from the host stream and each value's index, so a net trains alike on CPU and GPU, nothing is
drawn into an array or uploaded, and backward needs no mask kept, only the key. The CUDA
kernel (cuda/kernels/neuron.cu dropout_apply) and the compiled CPU map (cpu/kernels/dropout.c)
compute these bits; ``kept`` is numpy's reference and fallback.

bits(i) = mix(mix(i ^ key0) ^ key1) over uint32, mix being MurmurHash3's 32-bit finaliser;
index i is kept where bits >> 8 (24 bits, uniform in [0, 2^24)) >= ceil(ratio 2^24), so a
value is kept with probability 1 - ratio to within 2^-24.
"""
import math

import numpy as np

KEY_SPACE = 1 << 32
INDEX_LIMIT = 1 << 31           # the CUDA kernel's int indices


def threshold(ratio):
    return int(math.ceil(ratio * (1 << 24)))


def draw_key(stream):
    """Two uint32 words, one 64-bit draw of a numpy Generator's bits (its integers() costs
    ten times as much): one forward's draws."""
    word = int(stream.bit_generator.random_raw())
    return word & (KEY_SPACE - 1), word >> 32


def check_count(count):
    if count >= INDEX_LIMIT:
        raise ValueError("Dropout: a blob of %d values; at most %d" % (count, INDEX_LIMIT - 1))


def _mix(v):
    v ^= v >> np.uint32(16)
    v *= np.uint32(0x85EBCA6B)
    v ^= v >> np.uint32(13)
    v *= np.uint32(0xC2B2AE35)
    v ^= v >> np.uint32(16)
    return v


def kept(key, count, ratio):
    """The mask of indices [0, count) that the draws of ``key`` keep."""
    v = np.arange(count, dtype=np.uint32)
    v ^= np.uint32(key[0])
    v = _mix(v)
    v ^= np.uint32(key[1])
    return (_mix(v) >> np.uint32(8)) >= threshold(ratio)
