"""`maskrcnn-dist profile`: measure each movable module on this device, model every engine/split/replica
candidate, recommend one and write its topology.

measure.py (timings, bytes per cut, memory) -> candidates.py (what could run) -> cost_model.py (what each
would cost) -> recommend.py (ranking, the table, the limits) -> write.py (the topology file).
"""
