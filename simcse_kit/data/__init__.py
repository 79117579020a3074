"""Training data: the readers of text, CSV and JSONL files and the collator (``readers``),
several datasets in one run, each batch from one (``mixture``), and the loader settings for
the device (``pipeline``)."""
