"""The two programs a lab is made with (iproute2's ``ip`` and ``tc``), run as argument lists;
a failure becomes one LabError line naming the command and what it said."""
import os
import shutil
import subprocess


class LabError(RuntimeError):
    pass


def require_root_and_tools():
    """Raise LabError unless this process may make network namespaces with ``ip`` and ``tc``."""
    if os.geteuid() != 0:
        raise LabError("netlab needs root to make network namespaces (this process runs as "
                       "uid %d); nothing was created" % os.geteuid())
    missing = [name for name in ("ip", "tc") if tool(name) is None]
    if missing:
        raise LabError("netlab needs iproute2's ip and tc; not found: %s (apt-get install "
                       "iproute2); nothing was created" % ", ".join(missing))


def tool(name):
    """The path of ``ip`` or ``tc``: PATH first, then the sbin folders a root shell has."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def run(*args, check=True):
    """Run ``ip``/``tc`` ARGS...; stdout on success, LabError naming the command otherwise
    (``check=False``: None on failure, for teardown, which goes on whatever fails)."""
    argv = [tool(args[0]) or args[0]] + [str(a) for a in args[1:]]
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if not check:
            return None
        raise LabError("%s failed: %s" % (" ".join(args[:4]), exc)) from None
    if proc.returncode:
        if not check:
            return None
        said = (proc.stderr.strip() or proc.stdout.strip() or "exit status %d"
                % proc.returncode).splitlines()[0]
        raise LabError("`%s` failed: %s" % (" ".join(str(a) for a in args), said))
    return proc.stdout
