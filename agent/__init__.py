"""ModelGrid host agent: reports GPUs, runs model workers, serves inference. Never imports Django."""

__version__ = "0.1.0"
