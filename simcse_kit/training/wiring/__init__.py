"""A text run wired from a config: ``run`` (``build_run``, ``train``), its ``inputs``, the run
``folder``, seeds and sweeps (``experiments``)."""
