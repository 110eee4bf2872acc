"""The NVRTC and target a real driver builds its kernels with, chosen by the device and the
driver:

- A CUBIN for the device's own architecture (sm_90 on an H100) when an NVRTC knows it: it
  loads as it is, with no compile at load time, and a CUBIN from a newer NVRTC of the same
  CUDA major still loads on an older driver of that major.
- Else PTX for the newest virtual architecture below the device's, which the driver finishes
  at load time; the driver refuses PTX from an NVRTC newer than itself (CUDA 13.5's PTX on a
  13.0 driver), so that NVRTC is passed over.
- An NVRTC of a newer CUDA major than the driver is never used.

The NVRTCs tried are nvrtc.compilers(), newest major first; a real driver works the plan out
once (RealDriver.image_plan) and builds every source with it (build.image, cached on disk).
"""
from . import choice
from .driver import DriverError
from .nvrtc import NVRTCError, compilers


def plan(capability, driver_version, available):
    """(compiler, arch, cubin) for a device of ``capability`` (major, minor) under a driver of
    CUDA ``driver_version`` (13000; 0 when unknown), from the NVRTCs ``available``;
    DriverError saying why none fits."""
    cc = capability[0] * 10 + capability[1]
    driver = (driver_version // 1000, driver_version % 1000 // 10)
    reasons = []
    for compiler in available:
        version = tuple(compiler.version())
        label = "NVRTC %d.%d" % version
        if driver_version and version[0] > driver[0]:
            reasons.append("%s is newer than the driver's CUDA %d.%d" % ((label,) + driver))
            continue
        archs = compiler.supported_archs()
        if cc in archs and compiler.writes_cubin:
            return compiler, cc, True
        fitting = [a for a in archs if a <= cc]
        if not fitting:
            reasons.append("%s targets nothing at or below sm_%d" % (label, cc))
        elif driver_version and version > driver:
            reasons.append("%s writes PTX the CUDA %d.%d driver cannot read" % ((label,) + driver))
        else:
            return compiler, max(fitting), False
    raise DriverError("no NVRTC can build kernels for this device (compute capability %d.%d, "
                      "driver CUDA %s): %s" % (capability[0], capability[1],
                                               choice.version_text(driver_version),
                                               "; ".join(reasons) or "none installed"))


def device_plan(capability, driver_version):
    """plan() over the installed NVRTCs; DriverError when none is installed or fits."""
    try:
        return plan(capability, driver_version, compilers())
    except NVRTCError as exc:
        raise DriverError(str(exc)) from None


def describe_plan(chosen):
    """One line for device_query: the NVRTC and the target the kernels are built with."""
    compiler, arch, cubin = chosen
    return "NVRTC %d.%d (%s), %s" % (compiler.version() + (
        compiler.path, "CUBIN for sm_%d" % arch if cubin else "PTX for compute_%d" % arch))
