"""The hot path around the step engine: the proxy (read -> plan -> forward -> relay -> record),
the step's I/O, the answers besides the upstream's, admission's shared slots, the upstream
seam and the backends, post-hoc signals of a local answer.
"""
