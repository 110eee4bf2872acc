"""The one error every reader and writer of this package raises."""


class ProtoFileError(ValueError):
    """A file that is missing, malformed, truncated or of the wrong kind (one-line message)."""
