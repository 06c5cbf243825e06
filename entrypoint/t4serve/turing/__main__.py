"""`python -m t4serve.turing TARGET`: the Turing attention proof's child process (see t4serve.turing.worker)."""

from t4serve.turing.worker import main

raise SystemExit(main())
