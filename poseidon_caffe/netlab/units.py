"""Link rates and delays as a user writes them, checked against one small grammar.

Rate:    NUMBER UNIT, NUMBER a decimal (``100``, ``12.5``, ``.5``), UNIT one of
           bit, kbit, mbit, gbit, tbit   bits per second, SI multiples (tc's spelling; any case,
                                         an optional ``/s``: ``100Mbit/s``)
           B/s, KB/s, MB/s, GB/s         bytes per second, SI multiples (the ``B`` upper case;
                                         the ``/s`` required, so ``Mb`` is never guessed at)
         e.g. ``100mbit``, ``1gbit``, ``10gbit``, ``500kbit``, ``12.5MB/s``.
Delay:   NUMBER UNIT, UNIT one of us, ms, s (``0.5ms``, ``200us``); ``0`` alone is no delay.

Anything else, a rate of zero or a negative value raises UnitError, one line naming the string.
"""
import re

_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_BITS = {"bit": 1, "kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9, "tbit": 10 ** 12}
_BYTES = {"": 1, "k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9}
_RATE_BITS = re.compile(r"%s\s*([kKmMgGtT]?[bB][iI][tT])(?:/s)?" % _NUMBER)
_RATE_BYTES = re.compile(r"%s\s*([kKmMgG]?)B/s" % _NUMBER)
_DELAY = re.compile(r"%s\s*(us|ms|s)" % _NUMBER)
_DELAY_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}

RATE_EXAMPLES = "100mbit, 1gbit, 500kbit or 12.5MB/s"
DELAY_EXAMPLES = "5ms, 0.5ms, 200us or 0"


class UnitError(ValueError):
    pass


def parse_rate(text):
    """Bits per second (an int) of a rate string; UnitError names the string otherwise."""
    spelled = str(text).strip()
    match = _RATE_BITS.fullmatch(spelled)
    if match:
        bits = float(match.group(1)) * _BITS[match.group(2).lower()]
    else:
        match = _RATE_BYTES.fullmatch(spelled)
        if not match:
            raise UnitError("bandwidth %r does not parse: expected a number and a unit, e.g. %s"
                            % (str(text), RATE_EXAMPLES))
        bits = float(match.group(1)) * _BYTES[match.group(2).lower()] * 8
    if bits < 8:
        raise UnitError("bandwidth %r is too small: a link needs at least 8bit (one byte a "
                        "second)" % str(text))
    return int(round(bits))


def parse_delay(text):
    """Seconds (a float) of a delay string; UnitError names the string otherwise."""
    spelled = str(text).strip()
    if spelled == "0":
        return 0.0
    match = _DELAY.fullmatch(spelled)
    if not match:
        raise UnitError("latency %r does not parse: expected a number and a unit, e.g. %s"
                        % (str(text), DELAY_EXAMPLES))
    return float(match.group(1)) * _DELAY_UNITS[match.group(2)]


def rate_text(bits):
    """A rate in bits per second as tc and people read it: 1gbit, 100mbit, 1500kbit, 64bit."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        if bits % _BITS[unit] == 0:
            return "%d%s" % (bits // _BITS[unit], unit)
    return "%dbit" % bits


def delay_text(seconds):
    """A delay as tc reads it, in whole microseconds: 2500us."""
    return "%dus" % int(round(seconds * 1e6))
