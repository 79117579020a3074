"""The encoder: backbone + pooler + MLP and its self-describing save/load (``modeling``),
packed rows (``packing``), what differs between architectures (``families``), the precision
and device a run uses, gradient checkpointing for any encoder (``checkpointing``), checks of a
model folder on load, encoding sentences to vectors (``inference``), and the opt-in CPU fast
paths (``fastpath/``)."""
