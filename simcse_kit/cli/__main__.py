"""``python -m simcse_kit.cli``: the same as the ``simcse-kit`` console script."""

from simcse_kit.cli import main

raise SystemExit(main())
