"""What several launcher test files share: a stand-in trainer the launcher execs, the topology it runs
under, and an environment free of the variables the launcher reads."""

from __future__ import annotations

import os
import textwrap

from maskrcnn_launcher import contract

STAND_IN = textwrap.dedent(
    """
    import json, os, socket, sys

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    said_hello = []
    if rank == 0:
        # Like rank 0's TCPStore: listen on MASTER_PORT until every worker has said hello. The
        # workers' launchers probe the port first (connect, close: an empty read).
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(60)
            while len(said_hello) < world - 1:
                conn, _ = server.accept()
                with conn:
                    data = conn.recv(16)
                    if data:
                        said_hello.append(int(data))
    else:
        with socket.create_connection((addr, port), timeout=60) as conn:
            conn.sendall(str(rank).encode())
    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "MASKRCNN_POD_PLAN", "TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    print(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:], "hello": sorted(said_hello),
                      "env": {n: os.environ.get(n) for n in names}}))
    """
)

TOPOLOGY = """\
engine: pipeline
workers:
  - {devices: 0, stage: stage1}
  - {devices: 0, stage: stage2, replicas: 2}
stages:
  - {name: stage1, modules: [transform, backbone]}
  - {name: stage2, modules: [rpn, roi_heads]}
network: {master_port: 29500, interface: lo}
"""


def clean_env() -> dict[str, str]:
    """The test's environment without any variable the launcher reads (a CI runner may set HOSTNAME)."""
    env = {k: v for k, v in os.environ.items() if k not in contract.READ_VARS and k not in contract.EXPORTED_VARS}
    env["HOSTNAME"] = "test-host"
    return env
