"""The request timeout covers the prefill on the GPU too (issue 30, item 5): CudaRunner takes the
engine's `deadline` (engine.Runner, `checks_deadline`) and checks it between its MAX_BATCH-token
prefill chunks, after the previous chunk has finished on the device (launches are asynchronous:
a check between launches alone would see no time pass). The CPU runner's side is
tests/test_auth_health_timeout.py.

Run on a GPU machine: pytest -m gpu tests/test_gpu_request_timeout.py
"""

import pytest

pytestmark = pytest.mark.gpu


def test_the_cuda_prefill_stops_at_the_deadline_between_chunks():
    from fixtures import make_fixture

    from reflex_runtime.engine import GenerateRequest, Limits
    from reflex_runtime.errors import RequestTimeout
    from reflex_runtime.gpu.runner import MAX_BATCH
    from reflex_runtime.loader import load_engine

    eng = load_engine(str(make_fixture("qwen3", "q8_0").gguf), "cuda", max_context=4096, limits=Limits())
    runner = eng.runner
    assert getattr(runner, "checks_deadline", False), "CudaRunner does not take the engine's deadline yet"
    ids = [(7 * i + 11) % 1000 + 1 for i in range(6 * MAX_BATCH)]  # six chunks
    before = runner.forward_passes
    with pytest.raises(RequestTimeout):
        list(eng.generate(GenerateRequest(prompt="", max_tokens=4, time_limit_s=1e-6), prompt_ids=ids))
    assert runner.forward_passes - before <= 1, runner.forward_passes - before  # stopped after the first chunk
    # and the runner serves the next request normally
    events = list(eng.generate(GenerateRequest(prompt="", max_tokens=4, time_limit_s=60), prompt_ids=ids[:100]))
    assert events[-1].record["generated_tokens"] >= 1
