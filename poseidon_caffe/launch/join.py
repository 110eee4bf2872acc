"""One MPI job started host by host, the way Poseidon's cluster scripts start it.

Poseidon runs its program once per machine (``run_local.py <client_id> <hostfile>``, or
``caffe_main train --client_id=K --hostfile=F`` over ssh); client 0 is the name node, reached
at the address and port of its host-file line. MPICH's process manager, hydra, has a launcher
for this: ``mpiexec -launcher manual`` reaches no host itself, it prints one proxy command per
host (``HYDRA_LAUNCH: .../hydra_pmi_proxy --control-port ... --proxy-id k``) and waits for the
proxies to connect back. Each proxy starts its host's ranks, so every invocation starts the
ranks of its own host, and together they are one MPI job:

* client 0 starts ``mpiexec -launcher manual`` over the clients' hosts, listens on its own
  host-file port, hands each client that connects the command of its host's proxy, starts its
  own host's proxy, waits for mpiexec (which forwards every rank's output) and sends every
  client the job's exit status;
* client k > 0 connects to client 0's address and port (retrying while client 0 starts), says
  which client it is, receives its proxy's arguments, checks that they are a hydra proxy's,
  runs the local ``hydra_pmi_proxy`` with them and exits with the job's status.

Hydra gives one proxy to a host named twice; a client whose address an earlier client already
named (several clients on one machine) has its ranks started by that client's proxy and only
waits for the status. Messages are lines of JSON. ``POSEIDON_JOIN_TIMEOUT`` (seconds, default
120) bounds how long a client looks for client 0 and client 0 waits for the others.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

from .. import log
from .timeouts import JOIN_TIMEOUT_VARIABLE, seconds_from_env

PROXY = "hydra_pmi_proxy"
STOP_GRACE = 1.0      # seconds a process being ended has to go by itself before SIGKILL


class JoinError(RuntimeError):
    """A client could not join the job; the message names the client, address and cause."""


def _timeout():
    return seconds_from_env(JOIN_TIMEOUT_VARIABLE, 120)


def leader(hosts):
    """(client id, address, port) of the leading client: Poseidon's name node, client 0 (the
    lowest id of the host file)."""
    return min(hosts, key=lambda h: h[0])


def proxy_owners(hosts):
    """{client id: proxy index} for the clients whose host starts a proxy: hydra gives one to
    every distinct host name, in order of first appearance."""
    owners, seen = {}, {}
    for cid, ip, _ in hosts:
        if ip not in seen:
            seen[ip] = len(seen)
            owners[cid] = seen[ip]
    return owners


def manual_launch(mpiexec_args):
    """``mpiexec ARGS`` with hydra's manual launcher: insert ``-launcher manual``."""
    return [mpiexec_args[0], "-launcher", "manual"] + list(mpiexec_args[1:])


def _send(conn, message):
    conn.sendall((json.dumps(message) + "\n").encode())


def _lines(conn):
    buf = b""
    while True:
        chunk = conn.recv(4096)
        if not chunk:
            if buf.strip():
                yield json.loads(buf)
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


def run_client(client_id, hosts, mpiexec_args, stream=None):
    """Run this invocation's part of the job: client 0 leads, the others follow. Returns the
    job's exit status."""
    ids = [cid for cid, _, _ in hosts]
    if client_id not in ids:
        raise JoinError("client id %d is not in the host file (its clients are %s)"
                        % (client_id, ", ".join(map(str, ids))))
    if client_id == leader(hosts)[0]:
        return lead(hosts, mpiexec_args, stream)
    return follow(client_id, hosts)


def lead(hosts, mpiexec_args, stream=None):
    """Client 0: start mpiexec with the manual launcher, hand out the proxies, run our own."""
    stream = stream or sys.stdout
    timeout = _timeout()
    lead_id, lead_ip, port = leader(hosts)
    owners = proxy_owners(hosts)
    args = manual_launch(mpiexec_args)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("", port))
    except OSError as exc:
        server.close()
        raise JoinError("client %d cannot listen on port %d (its host-file line): %s"
                        % (lead_id, port, exc.strerror)) from None
    server.listen(len(hosts))
    stream.write(" ".join(args) + "\n")
    stream.flush()
    job = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, bufsize=1)
    proxies, local = [], None
    try:
        for line in job.stdout:
            if line.startswith("HYDRA_LAUNCH:"):
                proxies.append(line.split(":", 1)[1].split())
            elif line.startswith("HYDRA_LAUNCH_END"):
                break
            else:
                stream.write(line)
        if len(proxies) != len(set(ip for _, ip, _ in hosts)):
            raise JoinError("mpiexec announced %d proxies for the %d hosts of the host file"
                            % (len(proxies), len(set(ip for _, ip, _ in hosts))))
        forward = threading.Thread(target=_forward, args=(job.stdout, stream), daemon=True)
        forward.start()
        clients = _hand_out(server, hosts, owners, proxies, timeout, job)
        # this host's ranks start once every client has joined: a join that fails then has
        # none to tear down, and its one line is the report
        local = subprocess.Popen(proxies[owners[lead_id]]) if lead_id in owners else None
        status = _watch(job, clients, dict((cid, ip) for cid, ip, _ in hosts))
        if local is not None:
            local.wait()
        forward.join(5)
        for conn in clients.values():
            try:
                _send(conn, {"status": status})
                conn.close()
            except OSError:
                pass
        return status
    except BaseException:
        _end(job)              # mpiexec first: it tears down the proxies that connected
        _end(local)
        raise
    finally:
        server.close()


def _end(process, grace=STOP_GRACE):
    """Stop ``process`` if it still runs: SIGTERM, then SIGKILL after ``grace`` seconds.
    mpiexec with the manual launcher waits without limit for proxies that never connected,
    and a SIGTERM alone does not end that wait."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _watch(job, clients, address):
    """Wait for mpiexec; a client that leaves (or reports a failure) before the job ends takes
    its host's ranks with it, so the job is ended with its name."""
    import select
    while True:
        try:
            return job.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
        ready, _, _ = select.select(list(clients.values()), [], [], 0)
        for conn in ready:
            cid = next(c for c, k in clients.items() if k is conn)
            try:
                data = conn.recv(65536)
            except OSError:
                data = b""
            why = "left before the job ended"
            if data:
                try:
                    why = json.loads(data.splitlines()[0]).get("failed", why)
                except ValueError:
                    pass
            _end(job)
            raise JoinError("client %d (%s) %s" % (cid, address[cid], why))


def _forward(source, stream):
    for line in source:
        stream.write(line)
        stream.flush()


def _hand_out(server, hosts, owners, proxies, timeout, job):
    """Answer every other client once: its proxy's arguments (or none, when an earlier client
    on the same address starts its ranks). Returns {client id: connection}."""
    lead_id, lead_ip, port = leader(hosts)
    waiting = {cid: ip for cid, ip, _ in hosts if cid != lead_id}
    clients = {}
    deadline = time.monotonic() + timeout
    server.settimeout(0.5)
    while waiting:
        if job.poll() is not None:
            raise JoinError("mpiexec ended (status %d) before clients %s joined"
                            % (job.returncode, ", ".join(map(str, sorted(waiting)))))
        if time.monotonic() > deadline:
            raise JoinError("clients %s did not join within %g s (they connect to client %d at "
                            "%s:%d)" % (", ".join("%d (%s)" % (c, ip) for c, ip in
                                                  sorted(waiting.items())), timeout,
                                        lead_id, lead_ip, port))
        try:
            conn, _ = server.accept()
        except socket.timeout:
            continue
        conn.settimeout(timeout)
        try:
            hello = next(_lines(conn))
            cid = int(hello["client_id"])
        except (StopIteration, ValueError, KeyError, TypeError, OSError):
            conn.close()
            continue
        if cid not in waiting:
            _send(conn, {"error": "client %d is not expected (waiting for %s)"
                         % (cid, ", ".join(map(str, sorted(waiting))) or "nobody")})
            conn.close()
            continue
        del waiting[cid]
        index = owners.get(cid)
        _send(conn, {"proxy": proxies[index] if index is not None else None,
                     "clients": len(hosts)})
        clients[cid] = conn
    return clients


def follow(client_id, hosts):
    """Client k > 0: get this host's proxy from client 0, run it, return the job's status."""
    timeout = _timeout()
    lead_id, lead_ip, port = leader(hosts)
    deadline = time.monotonic() + timeout
    conn = None
    while conn is None:
        try:
            conn = socket.create_connection((lead_ip, port), timeout=5)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise JoinError("client %d: client %d does not answer at %s:%d within %g s (%s)"
                                % (client_id, lead_id, lead_ip, port, timeout,
                                   exc.strerror or exc)) from None
            time.sleep(0.2)
    conn.settimeout(None)
    _send(conn, {"client_id": client_id})
    replies = _lines(conn)
    try:
        first = next(replies)
    except StopIteration:
        raise JoinError("client %d: client %d at %s:%d closed the connection"
                        % (client_id, lead_id, lead_ip, port)) from None
    if "error" in first:
        raise JoinError("client %d: %s" % (client_id, first["error"]))
    proxy = first.get("proxy")
    if proxy is not None:
        try:
            command = local_proxy(proxy)
        except JoinError as exc:
            _send(conn, {"failed": str(exc)})
            raise
        log.info("Client %d of %d: starting this host's ranks: %s", client_id,
                 first.get("clients", len(hosts)), " ".join(command))
        subprocess.call(command)
    else:
        log.info("Client %d: an earlier client on this address starts its ranks", client_id)
    for message in replies:
        if "status" in message:
            return int(message["status"])
    raise JoinError("client %d: client %d at %s:%d ended without the job's status"
                    % (client_id, lead_id, lead_ip, port))


def local_proxy(args):
    """This host's hydra proxy with the arguments client 0 sent; anything else is refused."""
    if not args or os.path.basename(args[0]) != PROXY or not all(
            isinstance(a, str) and (a.startswith("--") or not a.startswith("-")
                                    or a[1:].isdigit()) for a in args[1:]):
        raise JoinError("client 0 sent %r, which is not a %s command" % (args, PROXY))
    here = shutil.which(PROXY) or os.path.join(os.path.dirname(sys.executable), PROXY)
    return [here] + list(args[1:])
