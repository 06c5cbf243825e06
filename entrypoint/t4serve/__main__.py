"""`python -m t4serve` is the same as the `t4serve` console script."""

from t4serve.cli import main

raise SystemExit(main())
