"""A llama-server replica's bytes from its GGUF header (estimate.py)."""

from agent.engines.llamacpp.estimate import RUNTIME_BYTES, estimate_gguf
from agent.engines.llamacpp.gguf_file import read_gguf


def test_it_counts_the_weights_as_stored_and_an_f16_kv_cache_for_the_context(ggufs):
    q4, f16 = read_gguf(ggufs["Q4_0"]), read_gguf(ggufs["F16"])
    est = estimate_gguf(q4, seq=256)
    assert est.weights_bytes == q4.weights_bytes < f16.weights_bytes / 3
    assert est.kv_cache_bytes == 256 * 512 and est.seq == 256
    assert est.total_bytes == est.weights_bytes + est.kv_cache_bytes + RUNTIME_BYTES
    assert (est.family, est.dtype) == ("llama+llamacpp", "q4_0")


def test_without_a_seq_it_takes_the_files_context_up_to_a_bound(ggufs):
    assert estimate_gguf(read_gguf(ggufs["Q8_0"])).seq == 256  # the tiny file's context_length
