"""Starting a job: Poseidon's host file (``hosts``), the ``mpiexec`` argument list every rank
runs in (``command``), the launcher that runs it and passes signals on (``launcher``), a job
started host by host (``join``), a job started over ssh (``poseidon_run``) and the deadlines
read from the environment (``timeouts``). Nothing here imports the sync runtime: the ranks it
starts do; their commands live in ``tools/`` (``launch``, ``join_client``, ``poseidon_run``).
"""
