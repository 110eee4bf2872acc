"""Where the stand-ins' headers come from, so that each stand-in compiles against NVIDIA's own
prototypes and a signature that drifts from the real one fails the build.

- cuda.h, cudaTypedefs.h and cudaProfilerTypedefs.h (the driver API and the ABI versions of its
  entry points), and the
  runtime headers cublas_api.h includes: NVIDIA's small ``nvidia-cuda-runtime`` wheel
  (``nvidia/cu13/include``), a dev dependency; else a CUDA toolkit (CUDA_HOME, CUDA_PATH,
  /usr/local/cuda).
- cublas_api.h, the few headers it includes that the runtime wheel lacks (crt/, nv/), and
  cudaProfiler.h (pycuda's): their wheels are read with HTTP range requests (the zip's central
  directory from the end of the file, then each member), each member checked against its
  CRC-32, and cached. The cuBLAS wheel is 444 MB; this reads about 400 kB. pip itself says
  where the pinned wheels are, so a mirror or a local wheel folder pip is configured with
  serves them too.
"""
import hashlib
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib

from poseidon_caffe.backend.cuda.build import write_atomic

from .errors import StandInUnavailable

RUNTIME_REQUIREMENT = "nvidia-cuda-runtime==13.0.96"
CUBLAS_REQUIREMENT = "nvidia-cublas==13.1.0.3"
INCLUDE = "nvidia/cu13/include/"
# the headers the stand-ins and pycuda need beyond the runtime wheel, by the pinned wheel
# holding them (the CUDA 13.0 toolkit's set: cuBLAS 13.1.0.3 came with CUDA 13.0 update 2)
FETCHED = {
    CUBLAS_REQUIREMENT: ("cublas_api.h",),
    "nvidia-cuda-crt==13.0.88": ("crt/host_defines.h",),
    "nvidia-cuda-cccl==13.0.85": ("nv/target", "nv/detail/__target_macros",
                                  "nv/detail/__preprocessor"),
    "nvidia-cuda-profiler-api==13.0.85": ("cudaProfiler.h",),
}
DRIVER_HEADERS = ("cuda.h", "cudaTypedefs.h", "cudaProfilerTypedefs.h")
TIMEOUT = 60

_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_ZIP64_EOCD = b"PK\x06\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
_TAIL = 65536 + 22                  # an end record and the longest comment it may carry


def cuda_include_dir():
    """The folder holding the DRIVER_HEADERS: the runtime wheel's, else a toolkit's."""
    from .pycuda_build import include_candidates
    for folder in include_candidates(wheel_first=True):
        if all(os.path.isfile(os.path.join(folder, h)) for h in DRIVER_HEADERS):
            return folder
    raise StandInUnavailable(
        "cuda.h is missing: pip install %s (in the dev extra), or set CUDA_HOME to a CUDA "
        "toolkit" % RUNTIME_REQUIREMENT)


def extra_include_dir(cache_root):
    """A folder holding the FETCHED headers (cublas_api.h...), fetched once into
    ``cache_root``; it goes before cuda_include_dir() on the include path."""
    tag = hashlib.sha256(repr(sorted(FETCHED.items())).encode()).hexdigest()[:12]
    folder = os.path.join(cache_root, "headers", "cuda-13.0-" + tag)
    missing = {requirement: [m for m in members if not os.path.isfile(os.path.join(folder, m))]
               for requirement, members in FETCHED.items()}
    missing = {requirement: members for requirement, members in missing.items() if members}
    if missing:
        try:
            for requirement, url in wheel_urls(sorted(missing)).items():
                with open_archive(url) as archive:
                    for member in missing[requirement]:
                        write_atomic(os.path.join(folder, member),
                                      read_member(archive, INCLUDE + member))
        except (OSError, ValueError, urllib.error.URLError, socket.timeout) as exc:
            raise StandInUnavailable("cannot fetch cublas_api.h and the headers beside it (%s): %s"
                                     % (", ".join(sorted(missing)), exc)) from None
    return folder


def wheel_urls(requirements):
    """{requirement: the address pip would download its wheel from}; nothing is downloaded
    (pip reads the metadata the index publishes beside each wheel)."""
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps",
               "--ignore-installed", "--only-binary=:all:", "--quiet", "--report", "-"]
    try:
        run = subprocess.run(command + list(requirements), capture_output=True, text=True,
                             timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise StandInUnavailable("pip does not run: %s" % exc) from None
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    if run.returncode != 0:
        raise StandInUnavailable("pip cannot find %s: %s" % (
            " ".join(requirements), lines[-1] if lines else "exit status %d" % run.returncode))
    try:
        found = {_canonical(item["metadata"]["name"]): item["download_info"]["url"]
                 for item in json.loads(run.stdout)["install"]}
        return {requirement: found[_canonical(requirement.split("==")[0])]
                for requirement in requirements}
    except (ValueError, KeyError):
        raise StandInUnavailable("pip's report does not name a wheel for each of %s"
                                 % " ".join(requirements)) from None


def _canonical(name):
    return name.lower().replace("_", "-").replace(".", "-")


# -- reading a zip from its end ----------------------------------------------------------------
class RemoteFile:
    """Byte ranges of a file at an http(s) address, one Range request each."""

    def __init__(self, url):
        self.url = url
        cafile = os.environ.get("PIP_CERT")        # the CA bundle pip is told to use, if any
        self.context = ssl.create_default_context(cafile=cafile if cafile and
                                                  os.path.isfile(cafile) else None)

    def _get(self, first, last=""):
        request = urllib.request.Request(self.url, headers={"Range": "bytes=%s-%s" % (first,
                                                                                    last)})
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=self.context) as reply:
            if reply.status != 206:
                raise ValueError("the server ignored a range request (HTTP %d)" % reply.status)
            return reply.read(), reply.headers.get("Content-Range", "")

    def tail(self, length):
        """(offset, bytes) of the file's last ``length`` bytes (all of it when shorter)."""
        data, content_range = self._get("", length)
        total = int(content_range.rsplit("/", 1)[1])
        return total - len(data), data

    def read(self, offset, length):
        if length == 0:
            return b""
        data, _ = self._get(offset, offset + length - 1)
        if len(data) != length:
            raise ValueError("asked %d bytes at %d, got %d" % (length, offset, len(data)))
        return data

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LocalFile(RemoteFile):
    """The same reads on a wheel in a local folder (a file: address from pip)."""

    def __init__(self, path):
        self.f = open(path, "rb")

    def tail(self, length):
        size = self.f.seek(0, os.SEEK_END)
        offset = max(0, size - length)
        return offset, self.read(offset, size - offset)

    def read(self, offset, length):
        self.f.seek(offset)
        data = self.f.read(length)
        if len(data) != length:
            raise ValueError("asked %d bytes at %d, got %d" % (length, offset, len(data)))
        return data

    def close(self):
        self.f.close()


def open_archive(url):
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        return LocalFile(urllib.request.url2pathname(parsed.path))
    if parsed.scheme in ("http", "https"):
        return RemoteFile(url)
    raise ValueError("cannot read %s" % url)


def _central_directory(archive):
    """The central directory's bytes, read from the end of the archive."""
    start, tail = archive.tail(_TAIL)
    at = tail.rfind(_EOCD)
    if at < 0:
        raise ValueError("no zip end record in the last %d bytes" % len(tail))
    entries, size, offset = struct.unpack_from("<6xHII", tail, at + 4)
    if offset == 0xFFFFFFFF or size == 0xFFFFFFFF or entries == 0xFFFF:
        locator = at - 20
        if locator < 0 or tail[locator:locator + 4] != _ZIP64_LOCATOR:
            raise ValueError("a zip64 archive without its locator")
        (record,) = struct.unpack_from("<Q", tail, locator + 8)
        head = archive.read(record, 56)
        if head[:4] != _ZIP64_EOCD:
            raise ValueError("a broken zip64 end record")
        size, offset = struct.unpack_from("<QQ", head, 40)
    if offset >= start:
        return tail[offset - start:offset - start + size]
    return archive.read(offset, size)


def read_member(archive, name):
    """The bytes of member ``name``, inflated and checked against its CRC-32."""
    central = _central_directory(archive)
    at = 0
    while at + 46 <= len(central) and central[at:at + 4] == _CENTRAL:
        (method, crc, packed, size, name_len, extra_len, comment_len,
         local) = struct.unpack_from("<10xH4xIIIHHH8xI", central, at)
        entry = central[at + 46:at + 46 + name_len].decode("utf-8")
        at += 46 + name_len + extra_len + comment_len
        if entry != name:
            continue
        if 0xFFFFFFFF in (packed, size, local):
            raise ValueError("%s has zip64 sizes, which this reader does not take" % name)
        head = archive.read(local, 30)
        if head[:4] != _LOCAL:
            raise ValueError("no local header for %s" % name)
        skip_name, skip_extra = struct.unpack_from("<HH", head, 26)
        data = archive.read(local + 30 + skip_name + skip_extra, packed)
        if method == 8:
            inflater = zlib.decompressobj(-15)
            data = inflater.decompress(data) + inflater.flush()
        elif method != 0:
            raise ValueError("%s is compressed with method %d" % (name, method))
        if len(data) != size or zlib.crc32(data) != crc:
            raise ValueError("%s does not match its CRC-32" % name)
        return data
    raise ValueError("the archive has no member %s" % name)
