"""scripts/compare_bench.py: compare.json rows from a reflex bench JSON and llama-bench's JSON."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compare_bench.py"


def test_rows_from_both_engines(tmp_path):
    bench = {"device": "H200", "decode": {"tokens": 128, "tok_s_median": 1000.0},
             "decode_at_depth": [{"depth": 4096, "tokens": 128, "tok_s": 700.0}],
             "prefill": [{"tokens": 512, "ms": 10.0, "tok_s": 51200.0}, {"tokens": 16, "ms": 1.0, "tok_s": 16000.0}]}
    llama = [{"n_prompt": 512, "n_gen": 0, "n_depth": 0, "avg_ts": 25600.0},
             {"n_prompt": 0, "n_gen": 128, "n_depth": 0, "avg_ts": 800.0},
             {"n_prompt": 0, "n_gen": 128, "n_depth": 4096, "avg_ts": 560.0},
             {"n_prompt": 2048, "n_gen": 0, "avg_ts": 9.0}]
    (tmp_path / "b.json").write_text(json.dumps(bench))
    (tmp_path / "l.json").write_text(json.dumps(llama))
    out = tmp_path / "compare.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--file", "f-q8_0", "--reflex", str(tmp_path / "b.json"),
                        "--llama", str(tmp_path / "l.json"), "--out", str(out), "--commit", "abc1234"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = {x["metric"]: x for x in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"tg128", "tg128@d4096", "pp512"}
    assert rows["tg128"]["ratio"] == 1.25 and rows["tg128@d4096"]["ratio"] == 1.25 and rows["pp512"]["ratio"] == 2.0
    assert all(x["commit"] == "abc1234" and x["file"] == "f-q8_0" for x in rows.values())
    assert "pp16" in r.stdout and "pp2048" in r.stdout  # measured by one engine only: said, not a row


def test_nothing_in_common_is_an_error(tmp_path):
    (tmp_path / "b.json").write_text(json.dumps({"decode": {"tokens": 64, "tok_s_median": 10.0}}))
    (tmp_path / "l.json").write_text(json.dumps([{"n_prompt": 0, "n_gen": 128, "avg_ts": 8.0}]))
    r = subprocess.run([sys.executable, str(SCRIPT), "--file", "f", "--reflex", str(tmp_path / "b.json"),
                        "--llama", str(tmp_path / "l.json"), "--out", str(tmp_path / "c.json")], capture_output=True,
                       text=True)
    assert r.returncode == 1 and not (tmp_path / "c.json").exists()
