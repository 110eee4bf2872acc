"""Link rates and delays for the simulator, in the grammar netlab's links are given in
(``netlab/units.py``: ``10gbit``, ``100mbit``, ``12.5MB/s``; ``50us``, ``0.2ms``, ``0``), so a
rate means the same to the simulator as to the shaped network that checks it. Rates come back
in bytes per second, delays in seconds; a bad one is a RateError naming the flag."""
from ..netlab.units import UnitError, parse_delay as _parse_delay, parse_rate as _parse_rate


class RateError(ValueError):
    """A rate or a delay that cannot be read; the message names the flag and the text."""


def parse_rate(text, what="-bandwidth"):
    """Bytes per second of a rate such as ``10gbit``."""
    try:
        return _parse_rate(text) / 8.0
    except UnitError as exc:
        raise RateError("%s=%r: %s" % (what, str(text), exc)) from None


def parse_delay(text, what="-latency"):
    """Seconds of a delay such as ``50us``; ``0`` is no delay."""
    try:
        return _parse_delay(text)
    except UnitError as exc:
        raise RateError("%s=%r: %s" % (what, str(text), exc)) from None
