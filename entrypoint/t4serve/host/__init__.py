"""The host side: what runs on the machine that holds the Docker engine, outside the container.

`engine` (the interface the host-side tools use to drive the engine, and its records), `docker` (that interface
through the `docker` and compose command-line clients) and `hostcheck` (can this host run the t4serve container:
driver, container toolkit, disk, memory, /dev/shm). Used by `t4serve host-check` and `t4serve mcp`.
"""
