#!/usr/bin/env bash
# Train googlenet on every host of the host file (Poseidon's localserver format) and every device.
# Usage: bash examples/googlenet/train_googlenet.sh [HOSTFILE]      (DRY_RUN=1 only prints the command)
set -euo pipefail

# ---- Poseidon's parameter block --------------------------------------------------------------
solver_filename="examples/googlenet/solver.prototxt"
snapshot_filename=""          # a .solverstate to resume from, or empty
num_app_threads=1             # devices (worker ranks) per host
param_table_staleness=0       # stale-synchronous bound (0 = bulk synchronous)
svb=true                      # sufficient factors for InnerProduct weights (Poseidon: true here)
devices="0"                   # comma-separated GPU ids, num_app_threads of them: one rank
                              # per id, binding that GPU (e.g. "0,1,2,3")
num_servers=0                 # dedicated parameter-server ranks (0: one shard per host)
# -----------------------------------------------------------------------------------------------

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
hostfile="${1:-$root/localserver}"
python="${PYTHON:-python}"
args=(-m poseidon_caffe.tools.launch --solver "$solver_filename" --hostfile "$hostfile"
      --devices "$devices" --num_app_threads "$num_app_threads"
      --staleness "$param_table_staleness" --svb "$svb"
      --num_servers "$num_servers"
      --dataset imagenet --output_root "$root/output")
if [ -n "$snapshot_filename" ]; then args+=(--snapshot "$snapshot_filename"); fi
if [ -n "${DRY_RUN:-}" ]; then args+=(--dry-run); fi
exec "$python" "${args[@]}"
