"""The gateway secret and the replica source shared by the tests that serve the agent app over fake replicas
(the `serve` fixture in conftest.py)."""

SECRET = "gw-secret-for-tests"
AUTH = {"Authorization": f"Bearer {SECRET}"}


class FakeSource:
    def __init__(self, *replicas):
        self.replicas = list(replicas)

    def handles(self):
        return self.replicas
