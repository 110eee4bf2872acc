"""The sync engine's threads while the interpreter exits: a main thread that leaves with an
error (a NaN loss) must not make the communication thread fail on its own, or the job's
report gains a second, misleading cause."""
import subprocess
import sys

# the communication thread hands numeric work to the offload's worker in a loop while the
# main thread leaves; an exit hook gives it time to run into whatever the exit stopped
LEAVING = r'''
import atexit, threading, time
from poseidon_caffe.sync.offload import Offload
offload = Offload()
failures, rounds = [], []

def communication():
    while True:
        try:
            rounds.append(offload.submit(lambda: 1).result())
        except Exception as exc:
            failures.append("%s: %s" % (type(exc).__name__, exc))
            return
        time.sleep(0.001)

threading.Thread(target=communication, daemon=True).start()
while len(rounds) < 5:
    time.sleep(0.01)

def report():
    before = len(rounds)
    time.sleep(0.3)
    print("failures %r, work done while leaving: %s" % (failures, len(rounds) > before))
atexit.register(report)
'''


def test_the_worker_thread_serves_the_communication_thread_while_the_main_thread_leaves():
    proc = subprocess.run([sys.executable, "-c", LEAVING], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "failures [], work done while leaving: True\n"
