"""`python -m t4serve.patch MODE TARGET`: the proof's child process (see t4serve.patch.worker)."""

from t4serve.patch.worker import main

raise SystemExit(main())
