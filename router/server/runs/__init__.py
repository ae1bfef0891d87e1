"""What the sidecar knows of a run: its identity, its lifecycle (resolve, end, idle), its
context (domain, task embedding), the runs list and the run-log writer.
"""
