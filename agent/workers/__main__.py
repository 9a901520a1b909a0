"""`python -m agent.workers <descriptor> <agent pid> spare|cold`: a worker process, as the agent starts it
(agent.workers.processes)."""

from agent.workers.process import run_from_argv

if __name__ == "__main__":
    run_from_argv()
