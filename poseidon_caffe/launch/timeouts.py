"""The deadlines a distributed job reads from its environment, checked as they are read: a
value that is not a positive number of seconds stops the job naming the variable."""
import math
import os

SYNC_TIMEOUT_VARIABLE = "POSEIDON_SYNC_TIMEOUT"
JOIN_TIMEOUT_VARIABLE = "POSEIDON_JOIN_TIMEOUT"


class TimeoutSettingError(ValueError):
    """An environment variable that should hold a number of seconds holds something else."""


def seconds_from_env(variable, default, environ=os.environ):
    """The positive, finite number of seconds in ``environ[variable]``, or ``default`` when it
    is unset or blank."""
    text = environ.get(variable, "").strip()
    if not text:
        return float(default)
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise TimeoutSettingError("%s=%r is not a number of seconds (expected a positive "
                                  "number, e.g. %g)" % (variable, text, default))
    return seconds
