"""The generic engine: the loop (``loop.fit``), the step contract (``steps``), checkpoints and
resume, dev selection, the run's guards and trackers, peers on several nodes, sharded engines.
It knows nothing of text: the digits demo trains an image encoder with it."""
