"""Training in three packages: the generic engine (``engine``: the loop, the step contract,
checkpoints and resume, dev selection, guards, trackers, peers, sharded engines), the objective
(``objective``: batch to loss, GradCache, the momentum queue, a mixture's per-dataset objectives,
the teacher's vectors) and a text run wired from a config (``wiring``: ``build_run``, ``train``)."""
