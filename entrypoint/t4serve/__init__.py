"""t4serve: serve Gemma 4 E2B with vLLM on a Tesla T4 (Turing) in one command.

The package is the container's entrypoint. Nothing imported at package level may pull in torch or vLLM:
the healthcheck and the preflight must start in a fraction of a second.
"""

__version__ = "0.1.0"
