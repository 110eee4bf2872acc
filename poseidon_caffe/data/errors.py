"""The one error of dataset files, shared by the database stores and the readers above them."""


class DataError(ValueError):
    """A dataset file that is missing, of the wrong kind or inconsistent; the message names it."""


def key_text(key):
    """A record's key as a reader of the log would want it."""
    try:
        return key.decode("ascii")
    except UnicodeDecodeError:
        return repr(key)
