"""What a worker is asked to run, and the tensors each task takes and gives (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.artifacts.dtypes import WORKER_DTYPES
from agent.engines import BUILTIN

Task = Literal["causal-lm", "encoder"]
DTYPES = WORKER_DTYPES


@dataclass(frozen=True)
class WorkerSpec:
    """One replica to load: picklable, sent to the worker process when it is spawned."""

    replica_id: int
    model_path: str
    task: Task
    device: str = "cpu"  # "cpu" or "cuda:N"
    dtype: str = "float32"
    deployment: str = ""  # the name inference requests use; the worker only logs it
    batch: int = 1  # the warm-up (and measurement) shape
    seq: int | None = None  # None: min(max positions, 2048); clamped to what the model takes
    reserved_bytes: int = 0  # the console's reservation on the GPU; 0: no limit
    gpu_total_bytes: int = 0  # the GPU's memory, to turn the reservation into a CUDA memory fraction
    mps_percentage: int | None = None  # CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, set before CUDA initialises
    memory_limit_bytes: int | None = None  # CPU workers: address space allowed beyond the worker's baseline
    threads: int | None = None  # CPU workers: torch intra-op threads (its share of the host's cores); None: torch's
    engine: str = BUILTIN.name  # what runs it (agent.engines); one in processes of its own is started by the worker
    # An engine in processes of its own (Engine.command): the program it runs (an interpreter, a binary), its
    # arguments after it (the port excepted), what its environment adds, and the deployment's own flags among its
    # arguments (a change restarts it).
    engine_python: str = ""
    engine_args: tuple[str, ...] = ()
    engine_env: tuple[tuple[str, str], ...] = ()
    engine_flags: tuple[str, ...] = ()
    revision: int = 0  # the console's revision of its artifacts (a new one restarts it)
    index: int | None = None  # its index among the deployment's replicas, as the console sent it (None: an older one)

    @property
    def label(self) -> str:
        """The replica as the console's pages and API name it ("chat#0"); its id when the console sent no index."""
        return f"{self.deployment}#{self.index}" if self.index is not None else str(self.replica_id)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # Open Inference Protocol datatype
    required: bool = False


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    output_rank: int


SIGNATURES: dict[str, Signature] = {
    "causal-lm": Signature(
        inputs=(TensorSpec("input_ids", "INT64", required=True), TensorSpec("attention_mask", "INT64")),
        output=TensorSpec("logits", "FP32"),
        output_rank=3,  # [batch, seq, vocab]
    ),
    "encoder": Signature(
        inputs=(
            TensorSpec("input_ids", "INT64", required=True),
            TensorSpec("attention_mask", "INT64"),
            TensorSpec("token_type_ids", "INT64"),
        ),
        output=TensorSpec("embeddings", "FP32"),
        output_rank=2,  # [batch, hidden]
    ),
}
