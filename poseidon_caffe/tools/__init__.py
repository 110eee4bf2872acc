"""The commands: every argument list is parsed here, and nowhere in the library.

One module per command or family of commands, each a thin layer over library functions that
take plain values: ``main`` (``poseidon-caffe``: finds the command, answers ``-help``),
``brew`` (Caffe's train, test, time, device_query), ``join_client`` (train by host file outside
mpiexec), ``upgrade``, ``data`` (convert_imageset, compute_image_mean, make_partitions),
``mnist`` (the quick start's digits), ``parse_log``, ``plot``, ``extract_features``,
``draw_net``, ``alias``, ``launch`` (the launcher and ``run_local.py``), ``supervise`` (what
runs in front of every rank), ``poseidon_run`` (``poseidon-run``); ``flags`` is Caffe's
gflags-style parsing they share. Nothing outside this package imports it, except the faces:
``poseidon_caffe.cli`` and the old names (``sync.launcher.run_local``, ``sync.psd_run.main``,
and the ``__main__`` lines of ``sync.launcher``, ``sync.psd_run``, ``data.mnist_embedded``).
"""
