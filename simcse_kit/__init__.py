"""simcse-kit: SimCSE sentence-embedding training, STS evaluation and export.

The package imports nothing here, so ``import simcse_kit.losses`` costs only what that
module needs; ``docs/architecture.md`` lists the modules and their layers.
"""

__version__ = "0.1.0"
