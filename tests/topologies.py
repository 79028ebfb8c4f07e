"""Topologies the tests of several suites run: a master and two CPU workers on loopback."""

# ddp: one CPU rank per pod (the elastic tests kill and drain its workers).
CPU_DDP_TOPOLOGY = """\
engine: ddp
workers:
  - {devices: 0}
  - {devices: 0}
network: {master_port: 29500, interface: lo}
"""
