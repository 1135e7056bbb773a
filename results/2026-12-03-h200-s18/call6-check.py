# reflex check on the qwen35moe Q8_0 test fixture with the long prompt of test_long_prompt_crosses_batches_and_chunks:
# the result without the token lists (routing_tie_rows: rows excused as routing near-ties)
import json, os, sys
sys.path.insert(0, "tests"); sys.path.insert(0, "scripts")
from fixtures import make_fixture
from reflex_runtime.commands.check import run_check
from reflex_runtime.families import load_reference
from reflex_runtime.loader import load_engine
eng = load_engine(str(make_fixture("qwen35moe", "q8_0").gguf), "cuda")
res = run_check(eng, load_reference(eng.gguf, eng.config),
                " ".join(["Once upon a time there was a small village by the sea, and"] * 55), 4)
print(os.environ.get("REFLEX_ROUTER_MM", "1"), json.dumps({k: v for k, v in res.items() if "tokens" not in k and "text" not in k}))
