"""Training: the generic loop (``loop.fit``), the step contract (``steps``), the objective
(``objectives``; per dataset of a mixture: ``mixture``), GradCache and the momentum queue, checkpoints and resume, dev selection,
the run's guards and trackers, sharded engines (``engines``: FSDP2, DeepSpeed ZeRO), the
teacher, mining, a teacher's scores of mined rows (``scoring``), and a text run wired from a
config (``run``, with its ``inputs`` and run ``folder``)."""
