"""Link rates and delays written as tc writes them.

Rates: a number and a unit, ``10gbit``, ``1.5Gbit``, ``100mbit``, ``40gbit``; ``bit``, ``kbit``,
``mbit``, ``gbit``, ``tbit`` are bits per second in powers of 1000, ``kibit`` ... ``tibit`` in
powers of 1024, and ``bps``, ``kbps``, ``mbps``, ``gbps``, ``tbps`` are *bytes* per second
(tc's meaning). Delays: ``50us``, ``0.2ms``, ``1s`` (also ``usec``, ``msec``, ``sec``).
"""
import re


class RateError(ValueError):
    """A rate or a delay that cannot be read; the message names the text and the flag."""


_SI = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_IEC = {"ki": 1024.0, "mi": 1024.0 ** 2, "gi": 1024.0 ** 3, "ti": 1024.0 ** 4}
_RATE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?)?(bit|bps)\s*", re.IGNORECASE)
_DELAY = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|sec|secs|ms|msec|msecs|us|usec|usecs|"
                    r"ns|nsec|nsecs)\s*", re.IGNORECASE)
_DELAY_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def parse_rate(text, what="-bandwidth"):
    """Bytes per second of a rate such as ``10gbit``."""
    match = _RATE.fullmatch(str(text))
    if not match:
        raise RateError("%s=%r is not a rate (expected a number and a unit as tc writes "
                        "them: 10gbit, 100mbit, 1.5gbit, 40gbit, 125mbps for bytes)"
                        % (what, text))
    value = float(match.group(1))
    prefix = (match.group(2) or "").lower()
    scale = _IEC[prefix] if prefix.endswith("i") else _SI[prefix]
    per_second = value * scale
    if match.group(3).lower() == "bit":
        per_second /= 8.0
    if per_second <= 0:
        raise RateError("%s=%r: a rate must be more than zero" % (what, text))
    return per_second


def parse_delay(text, what="-latency"):
    """Seconds of a delay such as ``50us``; a bare 0 is no delay."""
    if str(text).strip() == "0":
        return 0.0
    match = _DELAY.fullmatch(str(text))
    if not match:
        raise RateError("%s=%r is not a delay (expected a number and a unit: 50us, 0.2ms, "
                        "1ms, 0)" % (what, text))
    unit = match.group(2).lower()
    unit = {"sec": "s", "secs": "s", "msec": "ms", "msecs": "ms", "usec": "us",
            "usecs": "us", "nsec": "ns", "nsecs": "ns"}.get(unit, unit)
    return float(match.group(1)) * _DELAY_UNITS[unit]


def format_rate(bytes_per_second):
    """10gbit, 40gbit, 100mbit, 1.5gbit: the shortest tc spelling of a rate in bits."""
    bits = bytes_per_second * 8.0
    for unit, size in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= size:
            return "%g%s" % (bits / size, unit)
    return "%gbit" % bits
