"""scripts/bench_serve_host.py with the byte tokenizer (no files, no GPU): what it reports is
complete and its server is gone afterwards; correctness, not timings."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVEL_FIELDS = {"clients", "requests", "tokens", "failures", "failure_examples", "prompt_tokens", "wall_s", "tok_s",
                "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms", "server_cpu_us_per_tok", "server_user_us_per_tok",
                "server_sys_us_per_tok", "ctx_switches_per_tok", "vol_ctx_switches_per_tok",
                "invol_ctx_switches_per_tok", "steps", "rows_per_step", "step_p50_ms", "step_mean_ms", "in_step_ms",
                "profile"}


def test_bench_serve_host_reports_every_level_and_leaves_no_server(tmp_path):
    out, prof = tmp_path / "host.json", tmp_path / "prof"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_serve_host.py"), "--byte-tokenizer",
                        "--clients", "1,2", "--requests-per-client", "1", "--tokens", "16", "--profile", "cprofile",
                        "--stats-dir", str(prof), "--timeout", "20", "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["tokenizer"] == "bytes" and "--serve" in res["server"]
    assert [lv["clients"] for lv in res["levels"]] == [1, 2]
    for lv in res["levels"]:
        assert LEVEL_FIELDS <= set(lv), LEVEL_FIELDS - set(lv)
        assert lv["failures"] == 0, lv["failure_examples"]
        assert lv["requests"] == lv["clients"] and lv["tokens"] == 16 * lv["clients"]
        assert lv["steps"] > 0 and lv["rows_per_step"] >= 1 and lv["server_cpu_us_per_tok"] > 0
        assert lv["profile"] == str(prof / f"c{lv['clients']}.prof") and os.path.getsize(lv["profile"]) > 0
    assert f"{res['levels'][-1]['tok_s']:.0f}" in p.stdout  # the table
    # the server it spawned is gone: reaped, and its port refuses connections
    with pytest.raises(ProcessLookupError):
        os.kill(res["server_pid"], 0)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", res["port"]), timeout=2):
        pass
