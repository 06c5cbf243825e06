# t4serve:standin: the real image with the stand-in server (tests/standin/vllm_standin.py) on PATH as `vllm`, ahead of
# the real one, so supervision, phases, canary, crashes and drain can be tested without a GPU. Test use only.
# Build context: the repository root. Built by tests/image/test_supervision.py.
ARG BASE=t4serve:dev
FROM ${BASE}
USER root
# The working tree's t4serve over the image's own, the same way the image installs it (no deps, no index), so the
# supervision tests run the code under test even when BASE predates it; in CI both come from the same commit.
COPY pyproject.toml README.md /tmp/t4serve-src/
COPY entrypoint /tmp/t4serve-src/entrypoint
RUN set -eu; \
    pip install -q --no-deps --no-build-isolation --no-index /tmp/t4serve-src; \
    rm -rf /tmp/t4serve-src; \
    python3 -m compileall -q /opt/venv/lib/python3.13/site-packages/t4serve; \
    t4serve --version
# The stand-in plays `vllm serve`; any other `vllm` subcommand it hands to the real vLLM after it on PATH.
COPY tests/standin/vllm_standin.py /opt/standin/bin/vllm
RUN chmod 0755 /opt/standin/bin/vllm && test "$(command -v vllm)" = /opt/venv/bin/vllm
ENV PATH=/opt/standin/bin:$PATH
RUN test "$(command -v vllm)" = /opt/standin/bin/vllm
USER t4serve
