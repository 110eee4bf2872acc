"""What an exchange yields while it waits, so that whoever drives it (the scheduler's
communication thread, or ``Transport.drive``) knows what to wait for before resuming it."""


class Wait:
    """What an exchange yields: go on once every request has completed."""
    __slots__ = ("requests", "peers")

    def __init__(self, requests, peers=()):
        self.requests = [r for r in requests if r is not None]
        self.peers = peers


class Until:
    """What an exchange yields: go on once ``condition()`` holds (the services make it
    true)."""
    __slots__ = ("condition", "peers")

    def __init__(self, condition, peers=()):
        self.condition = condition
        self.peers = peers
