"""The method, in torch only: the contrastive losses, the masks of what may not count as a
negative, the per-mode table of views, the batch layout and the cross-process gathers.

Nothing here imports transformers, accelerate or any other ``simcse_kit`` package, so the
text trainer and the image demo call exactly the same code (``docs/architecture.md``).
"""
