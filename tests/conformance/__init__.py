"""One conformance suite for every backend: the same cases, run against each target.

A *target* (``target.py``) is one way to run a backend for real: the local
processes, Slurm through its commands, Slurm through slurmrestd, later Docker
through dockerd or Podman. Every case in ``test_*.py`` here is parametrized
over all targets, so a backend that behaves differently fails the case instead
of being left out of it.

Differences a backend cannot avoid are never skipped silently: a case reads
what the backend declares (its ``capabilities``, ``supervisor.validate.Capabilities``,
and whether it is ``durable``) and asserts the behaviour that declaration
promises. A retry policy a backend does not declare, for instance, must be
rejected by ``submit`` and ``dryrun`` with a ``SpecError`` naming
``retry_policy``; a durable backend's apps must outlive their Supervisor and a
non-durable one's must be stopped by its close. A target skips (printing why)
only when its component truly cannot start, from ``Target.ensure``.

Adding a target
---------------
Write one module ``tests/conformance/targets_<name>.py`` that exposes
``TARGETS: list[Target]``; ``conftest.py`` imports every ``targets_*`` module
it finds, nothing else needs to change. Subclass ``Target`` and give it:

- ``id`` (the pytest id, e.g. ``"docker-podman"``), ``backend`` (the name
  handles and ``submit`` use) and ``marks`` (e.g. ``pytest.mark.slurm`` so
  the cluster's tests can be selected or left out);
- ``ensure()``: bring the component up or check it, ``pytest.skip`` with a
  printed reason only when it cannot start;
- ``backends()``: the ``Supervisor(backends=...)`` factories that pick the
  transport or engine (``None`` for the built-in defaults);
- ``cli_env()``: the environment an ``asupervisor`` subprocess needs to make
  the same choice;
- ``cfg(workdir)``: the run options every case submits with (``log_dir`` ...);
- ``role(...)``: how a replica running a POSIX ``sh`` script is spelled on this
  backend (image, entrypoint, and how the case's exchange directory, a host
  directory the replicas and the test both read and write, is made visible
  as ``$CONF_DIR``: containers bind-mount it);
- ``timeout``: how long a case waits for a short app to end (queues are slow).

Run only some targets with ``-k`` on the id (``-k local``) or with markers
(``-m "not slurm"``); Slurm targets must run under the cluster lock:
``flock /tmp/asv-slurm.lock .venv/bin/python -m pytest tests/conformance -m slurm``.
"""
