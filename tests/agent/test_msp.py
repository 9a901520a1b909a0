"""The Model Server Protocol's metrics (agent.msp): each engine's figures mapped to the names, types and labels an
endpoint picker reads, and the page it scrapes parsed back with prometheus_client's own parser."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.msp import EndpointLoad, builtin_load, combine, llamacpp_load, render, vllm_load
from agent.protocol import AdapterStatus
from agent.workers.generation_spec import EngineStats

# A vLLM page modelled on vLLM 0.32's (vllm/v1/metrics/loggers.py; real ones are in pages/): per-engine gauges labelled
# engine and model_name, one lora_requests_info series per combination of lists it has seen (its value the time it
# was last set), and cache_config_info with every CacheConfig field as a label.
VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="chat"} 5.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="chat"} 0.25
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.7650e+09
vllm:lora_requests_info{max_lora="4",running_lora_adapters="fr,de",waiting_lora_adapters="es"} 1.7651e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="",\
num_gpu_blocks="2048",num_cpu_blocks="None"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="chat"} 1234.0
"""

# llama.cpp's server with --metrics (names as in xllamacpp's build: no KV usage any more).
LLAMACPP_PAGE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 40
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def parsed(page: bytes) -> dict:
    """name -> (type, [labels with the value under "value"]), as a picker's Prometheus text parser reads them."""
    return {f.name: (f.type, [s.labels | {"value": s.value} for s in f.samples])
            for f in text_string_to_metric_families(page.decode())}


def torch_handle(stats=EngineStats(), capacity=1000, adapters=(), wanted=(), max_loras=None, deployment="chat"):
    info = {"kv_capacity_bytes": capacity}
    if max_loras is not None:
        info["max_loras"] = max_loras
    return SimpleNamespace(spec=SimpleNamespace(deployment=deployment), engine_stats=stats, info=info,
                           adapter_stats=list(adapters), adapters=set(wanted))


def adapter(name, tier):
    return AdapterStatus(name=name, tier=tier, nbytes=100)


def test_it_renders_the_protocols_series_under_vllms_names_types_and_labels():
    load = EndpointLoad("chat", waiting=2, running=3, kv_usage=0.5, running_adapters=("de", "fr"),
                        waiting_adapters=("es",), max_lora=4, block_size=16, num_blocks=2048)
    families = parsed(render(load, now=1765000000.0))
    assert families["vllm:num_requests_waiting"] == ("gauge", [{"model_name": "chat", "value": 2}])
    assert families["vllm:num_requests_running"] == ("gauge", [{"model_name": "chat", "value": 3}])
    assert families["vllm:kv_cache_usage_perc"] == ("gauge", [{"model_name": "chat", "value": 0.5}])
    assert families["vllm:lora_requests_info"] == ("gauge", [{
        "model_name": "chat", "max_lora": "4", "running_lora_adapters": "de,fr", "waiting_lora_adapters": "es",
        "value": 1765000000.0}])
    assert families["vllm:cache_config_info"] == ("gauge", [{
        "model_name": "chat", "block_size": "16", "num_gpu_blocks": "2048", "value": 1}])


def test_it_leaves_out_what_the_engine_does_not_say_rather_than_report_zero():
    families = parsed(render(EndpointLoad("embed", waiting=0, running=1)))
    assert set(families) == {"vllm:num_requests_waiting", "vllm:num_requests_running"}


def test_a_torch_replicas_figures_come_from_its_batcher_its_kv_share_and_its_adapter_pool():
    stats = EngineStats(running=2, waiting=3, kv_cache_bytes=250, running_adapters=("fr",), waiting_adapters=("es",))
    handle = torch_handle(stats, capacity=1000, adapters=[adapter("de", "gpu"), adapter("it", "cpu")],
                          wanted={"de", "it", "fr", "es"}, max_loras=3)
    load = builtin_load(handle)
    assert (load.waiting, load.running, load.kv_usage) == (3, 2, 0.25)
    # Running: what its batch runs and what its device tier holds (a request for either needs no load).
    assert load.running_adapters == ("de", "fr") and load.waiting_adapters == ("es",) and load.max_lora == 3
    assert load.block_size is None  # no paged cache: nothing for a prefix scorer


def test_a_torch_replicas_kv_usage_is_capped_at_full_and_unknown_without_a_capacity():
    assert builtin_load(torch_handle(EngineStats(kv_cache_bytes=5000), capacity=1000)).kv_usage == 1.0
    assert builtin_load(torch_handle(EngineStats(kv_cache_bytes=5000), capacity=0)).kv_usage is None


def test_a_torch_replica_without_adapters_says_nothing_of_lora():
    assert builtin_load(torch_handle()).max_lora is None
    assert "vllm:lora_requests_info" not in parsed(render(builtin_load(torch_handle())))


def test_vllms_own_page_is_read_as_a_picker_reads_it():
    load = vllm_load("chat", VLLM_PAGE)
    assert (load.waiting, load.running, load.kv_usage) == (5, 3, 0.25)
    # The newest lora_requests_info series is the current one.
    assert load.running_adapters == ("fr", "de") and load.waiting_adapters == ("es",) and load.max_lora == 4
    assert (load.block_size, load.num_blocks) == (16, 2048)


@pytest.mark.parametrize("when, running, adapters", [("busy", 3, ("fr",)), ("idle", 0, ())])
def test_a_real_vllms_pages_are_read_busy_and_idle(when, running, adapters):
    # vLLM 0.32's CPU build serving the tiny Llama with one adapter, "fr" (--max-loras 2), while four requests for
    # it ran and after: its protocol families as it wrote them. Idle, the newest lora series has empty lists.
    text = (Path(__file__).parent / "pages" / f"vllm-0.32-cpu-{when}.txt").read_text()
    load = vllm_load("chat", text)
    assert (load.running, load.waiting, load.running_adapters, load.max_lora) == (running, 0, adapters, 2)
    assert (load.block_size, load.num_blocks) == (128, 16384) and 0 <= load.kv_usage < 0.01
    assert (load.kv_usage > 0) == (when == "busy")


def test_an_older_vllms_gpu_cache_usage_stands_in_for_kv_cache_usage():
    old = VLLM_PAGE.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert vllm_load("chat", old).kv_usage == 0.25


def test_a_vllm_without_lora_or_before_its_cache_is_sized_says_neither():
    page = "\n".join(line for line in VLLM_PAGE.splitlines() if "lora" not in line)
    page = page.replace('num_gpu_blocks="2048"', 'num_gpu_blocks="None"')
    load = vllm_load("chat", page)
    assert load.max_lora is None and load.running_adapters == () and load.num_blocks is None


def test_llamacpps_page_gives_requests_and_no_kv_usage():
    load = llamacpp_load("tiny", LLAMACPP_PAGE)
    assert (load.waiting, load.running, load.kv_usage, load.max_lora) == (1, 2, None, None)
    with_kv = LLAMACPP_PAGE + "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.4\n"
    assert llamacpp_load("tiny", with_kv).kv_usage == 0.4


def test_a_hosts_replicas_of_one_deployment_combine_into_one_endpoint():
    a = EndpointLoad("chat", waiting=1, running=2, kv_usage=0.2, running_adapters=("fr",), max_lora=2,
                     block_size=16, num_blocks=100)
    b = EndpointLoad("chat", waiting=3, running=0, kv_usage=0.8, waiting_adapters=("de",), max_lora=4,
                     block_size=16, num_blocks=300)
    both = combine("chat", [a, b])
    assert (both.waiting, both.running, both.max_lora) == (4, 2, 6)
    assert both.kv_usage == pytest.approx((0.2 * 100 + 0.8 * 300) / 400)
    assert both.running_adapters == ("fr",) and both.waiting_adapters == ("de",)
    assert (both.block_size, both.num_blocks) == (16, 400)
    mixed = combine("chat", [a, EndpointLoad("chat", kv_usage=0.4)])
    assert mixed.block_size is None and mixed.kv_usage == pytest.approx(0.3)


def test_a_handle_counts_the_adapters_a_batch_may_mix_from_its_device_tiers_budget():
    import asyncio

    from agent.workers.handle import WorkerHandle
    from agent.workers.spec import WorkerSpec

    handle = WorkerHandle(WorkerSpec(1, "/m", "causal-lm", deployment="chat"), asyncio.Queue())
    rows = [{"name": n, "tier": t, "pinned": False, "nbytes": b, "requests": 0, "hits": 0, "misses": 0}
            for n, t, b in (("fr", "gpu", 100), ("de", "cpu", 300), ("es", "disk", 200))]
    totals = {"hits": 0, "misses": 0, "evictions": 0, "adapters": 3, "gpu_budget": 1000}
    handle._take_adapter_stats({"stats": {"adapters": rows, "totals": totals}})
    assert handle.info["max_loras"] == 3  # 1000 bytes of device tier hold three of its largest (300)
    handle.adapters = {"fr", "de", "es"}
    load = builtin_load(handle)
    assert load.max_lora == 3 and load.running_adapters == ("fr",)
