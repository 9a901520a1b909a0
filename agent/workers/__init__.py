"""Model workers: supervision on the daemon side (no torch) and the worker process (torch).

Import nothing here: the daemon imports `agent.workers.supervisor`, and only worker processes
import `agent.workers.runtime`, which imports torch.
"""
