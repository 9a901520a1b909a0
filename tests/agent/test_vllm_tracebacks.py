"""The line of vLLM's output that says why it failed."""

from agent.vllm.tracebacks import Tracebacks


def fed(text: str) -> Tracebacks:
    found = Tracebacks()
    for line in text.splitlines():
        found.feed(line)
    return found


def test_the_root_cause_wins_over_the_wrapper_after_it_and_the_noise():
    found = fed("""INFO 11-29 10:00:00 [api_server.py:1] vLLM API server version 0.32.0
(EngineCore_DP0 pid=4242) ERROR 11-29 10:00:01 [core.py:708] EngineCore failed to start.
(EngineCore_DP0 pid=4242) Traceback (most recent call last):
(EngineCore_DP0 pid=4242)   File "vllm/v1/engine/core.py", line 699, in run_engine_core
(EngineCore_DP0 pid=4242)     raise ValueError("no room")
(EngineCore_DP0 pid=4242) ValueError: no room: try a smaller max_model_len
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: leaked
""")
    assert found.cause() == "ValueError: no room: try a smaller max_model_len"


def test_only_a_tracebacks_own_exception_line_counts_and_a_wrapper_alone_is_still_told():
    assert fed("Loading: 100%\nWARNING x.py:3: DeprecationWarning: old\nKeyError: 'not in a traceback'").cause() == ""
    assert fed("Traceback (most recent call last):\n  File 'x'\nEngineDeadError: EngineCore encountered an issue."
                ).cause() == "EngineDeadError: EngineCore encountered an issue."
    assert fed("Traceback (most recent call last):\n  File 'x'\ntorch.OutOfMemoryError: CUDA out of memory"
               ).cause() == "torch.OutOfMemoryError: CUDA out of memory"
