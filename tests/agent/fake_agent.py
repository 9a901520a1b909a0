"""`python -m tests.agent.fake_agent run ...`: the agent's command line, with torch-free workers
(tests.agent.fake_worker), for tests that kill a whole agent process."""

import sys

from agent import cli
from agent.workers import environment, processes
from tests.agent.fake_worker import COMMAND

if __name__ == "__main__":
    processes.WORKER_COMMAND = COMMAND
    environment.KEPT_NAMES |= {"MODELGRID_FAKE_LOADS"}  # the fake workers' load log, past the workers' allowlist
    sys.exit(cli.main())
