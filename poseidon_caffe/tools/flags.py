"""Command-line flags the way Caffe's tools take them (gflags): ``-flag=v``, ``--flag=v``,
``-flag v``, booleans as ``-flag``, ``-flag=false`` or ``-noflag``. Anything not starting with a
dash is positional; ``--`` ends the flags. ``-help``, ``--help`` or ``-h`` anywhere before ``--``
asks for a command's usage (``wants_help``), which ``documented`` attaches to its function.
"""

HELP_ARGS = ("-h", "-help", "--help", "-helpfull", "--helpfull", "-helpshort", "--helpshort")


class FlagError(ValueError):
    """A flag that is unknown or has a value of the wrong kind; the message names it."""


class Flag:
    def __init__(self, name, default, help="", kind=None):
        self.name = name
        self.default = default
        self.help = help
        self.kind = kind or (type(default) if default is not None else str)

    def convert(self, text):
        if self.kind is bool:
            low = text.lower()
            if low in ("1", "true", "t", "yes", "y"):
                return True
            if low in ("0", "false", "f", "no", "n"):
                return False
            raise FlagError("flag -%s takes true or false, not %r" % (self.name, text))
        try:
            return self.kind(text)
        except ValueError:
            raise FlagError("flag -%s takes a%s %s value, not %r"
                            % (self.name, "n" if self.kind is int else "",
                               self.kind.__name__, text)) from None


def parse(argv, flags):
    """Parse ``argv`` against ``flags`` (a list of Flag). Returns (values dict, positionals)."""
    by_name = {f.name: f for f in flags}
    values = {f.name: f.default for f in flags}
    positional = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional.extend(args[i:])
            break
        if not arg.startswith("-") or arg == "-" or _is_number(arg):
            positional.append(arg)
            continue
        body = arg.lstrip("-")
        name, eq, text = body.partition("=")
        flag = by_name.get(name)
        if flag is None and name.startswith("no") and not eq:
            negated = by_name.get(name[2:])
            if negated is not None and negated.kind is bool:
                values[negated.name] = False
                continue
        if flag is None:
            known = ", ".join("-" + f.name for f in flags)
            raise FlagError("unknown flag %r (known flags: %s)" % (arg, known))
        if not eq:
            if flag.kind is bool:
                nxt = args[i] if i < len(args) else None
                if nxt is not None and nxt.lower() in ("true", "false"):
                    values[name] = flag.convert(nxt)
                    i += 1
                else:
                    values[name] = True
                continue
            if i >= len(args):
                raise FlagError("flag -%s needs a value" % name)
            text = args[i]
            i += 1
        values[name] = flag.convert(text)
    return values, positional


def _is_number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def usage(flags):
    lines = []
    for f in flags:
        lines.append("  -%s (%s) default: %r" % (f.name, f.help, f.default))
    return "\n".join(lines)


def wants_help(argv):
    """Whether ``argv`` asks for usage: a help flag before any ``--``."""
    for arg in argv:
        if arg == "--":
            return False
        if arg in HELP_ARGS:
            return True
    return False


def documented(usage_text, flags=()):
    """Give a command's main function its usage text and flags, which ``-help`` prints."""
    def attach(function):
        function.usage = usage_text
        function.flags = list(flags)
        return function
    return attach
