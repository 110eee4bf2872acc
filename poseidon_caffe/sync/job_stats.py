"""A rank's sync statistics at the end of a session: ``sync_stats.rank<r>.json`` in the output
folder, and, with Poseidon's ``-stats_path``, one file of every worker's (JSON, which YAML
readers take as well)."""
import json
import os

from .. import log


def write_rank_stats(stats, output_dir, rank):
    if output_dir:
        path = os.path.join(output_dir, "sync_stats.rank%d.json" % rank)
        with open(path, "w") as f:
            json.dump(stats, f, indent=1, sort_keys=True)


def write_job_stats(stats, topology, stats_path):
    """Gather every worker's ``stats`` (collective over the workers); rank 0 writes them."""
    if not stats_path:
        return
    everyone = topology.world.gather_object(stats, root=0)
    if topology.rank != 0:
        return
    parent = os.path.dirname(stats_path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(stats_path, "w") as f:
        json.dump({"workers": everyone}, f, indent=1, sort_keys=True)
    log.info("Sync statistics of %d workers written to %s", len(everyone), stats_path)
