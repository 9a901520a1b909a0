"""The line of vLLM's output that says why it failed."""

from agent.engines.vllm.tracebacks import Tracebacks


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


def test_a_validation_error_of_vllms_configuration_is_told_with_its_reason_not_its_echoed_input():
    """What vLLM 0.32 printed for a max_model_len past the model's positions (its pydantic ModelConfig refused it):
    the exception line names only the class, and the reason follows, indented."""
    found = fed("""Traceback (most recent call last):
  File "vllm/engine/arg_utils.py", line 1955, in create_model_config
    return ModelConfig(
           ^^^^^^^^^^^^
pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig
  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len. [type=value_error, \
input_value=ArgsKwargs((), {'model': ...}), input_type=ArgsKwargs]
    For further information visit https://errors.pydantic.dev/2.14/v/value_error
""")
    assert found.cause() == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig; Value "
                             "error, User-specified max_model_len (100000) is greater than the derived max_model_len.")


def test_a_traceback_vllm_logs_line_by_line_is_read_through_its_log_prefix():
    """What vLLM 0.32's CPU build printed for --block-size 16 (its CPU attention takes multiples of 32): its worker
    logs the root cause, its engine core and API server wrap it twice."""
    log = "(Worker pid=23373) ERROR 12-07 01:44:17 [multiproc_executor.py:1063] "
    core = "(EngineCore pid=22952) ERROR 12-07 01:44:17 [core.py:1510] "
    found = fed(f"""{log}Traceback (most recent call last):
{log}  File "vllm/v1/worker/utils.py", line 554, in select_common_block_size
{log}    raise ValueError(
{log}ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).
{core}Traceback (most recent call last):
{core}    raise RuntimeError(
{core}RuntimeError: Worker failed with error 'No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).', please \
check the stack trace above for the root cause
Traceback (most recent call last):
    raise RuntimeError(
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}
""")
    assert found.cause() == "ValueError: No common block size for 16 (CPU_ATTN: [MultipleOf(32)])."
