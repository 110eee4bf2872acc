"""The one error a stand-in build raises for something the machine lacks (a compiler, libffi,
a header it could not fetch): callers turn it into a skip that names what is missing, while a
stand-in that fails to compile for any other reason stays an error."""


class StandInUnavailable(RuntimeError):
    """Something the stand-ins need is missing; the message says what and how to get it."""
