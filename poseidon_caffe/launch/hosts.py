"""Poseidon's host file (``localserver``): one machine per line, ``<client_id> <ip> <port>``.

Ids are distinct integers, the address must resolve, the port is an integer (MPI does not use
it, but the file parses as Poseidon's does). Before a job starts, every host must answer from
here (``check_reachable``). The launcher and a rank started host by host read it alike.
"""
import socket


class HostFileError(ValueError):
    pass


def read_localserver(path):
    """[(client_id, ip, port)] in file order; HostFileError names the file and line."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise HostFileError("cannot read host file %s: %s" % (path, exc.strerror)) from None
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise HostFileError("host file %s is not text: byte %d is not UTF-8"
                            % (path, exc.start)) from None
    hosts, seen = [], {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        fields = text.split()
        where = "%s:%d" % (path, number)
        if len(fields) != 3:
            raise HostFileError("%s: expected '<client_id> <ip> <port>' (3 fields), got %d: %r"
                                % (where, len(fields), line))
        cid, ip, port = fields
        try:
            cid = int(cid)
        except ValueError:
            raise HostFileError("%s: client id %r is not an integer" % (where, cid)) from None
        try:
            port = int(port)
        except ValueError:
            raise HostFileError("%s: port %r is not an integer" % (where, port)) from None
        if not 0 < port < 65536:
            raise HostFileError("%s: port %d is out of range 1..65535" % (where, port))
        if cid in seen:
            raise HostFileError("%s: duplicate client id %d (first on line %d)"
                                % (where, cid, seen[cid]))
        seen[cid] = number
        try:
            socket.getaddrinfo(ip, None)
        except (socket.gaierror, UnicodeError):
            raise HostFileError("%s: unknown host %r (it does not resolve)" % (where, ip)) from None
        hosts.append((cid, ip, port))
    if not hosts:
        raise HostFileError("host file %s lists no machines" % path)
    return hosts


def _unreachable(ip, port, timeout):
    """Why ``ip`` cannot be reached from here, or None when it can: it is this machine, or it
    accepts or refuses a TCP connection on the host file's port or on ssh's (a refusal is an
    answer; only silence or an error of the network is not)."""
    try:
        family, _, _, _, address = socket.getaddrinfo(ip, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError):
        return "it does not resolve"
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((address[0], 0))
        return None                               # an address of this machine
    except OSError:
        pass
    for p in dict.fromkeys((port, 22)):
        try:
            with socket.create_connection((address[0], p), timeout=timeout):
                return None
        except ConnectionRefusedError:
            return None
        except socket.timeout:
            continue
        except OSError as exc:
            return exc.strerror or str(exc)
    return "no answer on port %s within %g s" % (" or ".join(str(p) for p in
                                                           dict.fromkeys((port, 22))), timeout)


def check_reachable(hosts, hostfile, timeout=2.0):
    """HostFileError naming the first host of ``hosts`` (read_localserver's list) that this
    machine cannot reach, and the file; the hosts are tried at once, each within 2 x
    ``timeout`` seconds."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        reasons = list(pool.map(lambda h: _unreachable(h[1], h[2], timeout), hosts))
    for (cid, ip, _), reason in zip(hosts, reasons):
        if reason:
            raise HostFileError("%s: client %d's host %s is unreachable from here (%s)"
                                % (hostfile, cid, ip, reason))
