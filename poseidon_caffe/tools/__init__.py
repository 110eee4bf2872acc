"""The commands: every argument list is parsed here, and nowhere in the library.

One module per command or family of commands, each a thin layer over library functions that take
plain values: ``main`` (``poseidon-caffe``: finds the command, answers ``-help``),
``caffe_tool`` (the caffe tool's train, test, time, device_query), ``join_client`` (train by
host file outside mpiexec), ``upgrade``, ``datasets`` (convert_imageset, compute_image_mean,
make_partitions), ``mnist`` (the quick start's digits), ``training_log`` (parse_log),
``plot_log`` (plot), ``extract_features``, ``draw_net``, ``alias``, ``launch`` (the launcher and
``run_local.py``), ``supervise`` (what runs in front of every rank), ``poseidon_run``
(``poseidon-run``); a command over one library module bears its name. ``flags`` is Caffe's
gflags-style parsing they share. Nothing outside this package imports it but its face,
``poseidon_caffe.cli``.
"""
