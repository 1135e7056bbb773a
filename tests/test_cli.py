"""The `reflex` command line: one-line errors with distinct exit codes, doctor, the build fallback."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reflex_runtime.errors import ModelFileError, RequestError, UnsupportedModelError

ENV = dict(os.environ, PYTHONUNBUFFERED="1")


def reflex(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "reflex_runtime.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout)


def one_line_error(r, code, needle):
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reflex: error: "), r.stderr
    assert needle in lines[0], lines[0]
    assert r.stdout == ""


def write_gguf(path, arch, tensors):
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    for name, (data, raw_type) in tensors.items():
        if raw_type is None:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=raw_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_missing_file(tmp_path):
    one_line_error(reflex("generate", "hi", "--model", str(tmp_path / "none.gguf"), "--backend", "cpu"),
                   ModelFileError.exit_code, "not found")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("this is not a model\n" * 10)
    one_line_error(reflex("generate", "hi", "--model", str(p), "--backend", "cpu"), ModelFileError.exit_code,
                   "not a GGUF file")


def test_unsupported_architecture_is_named_with_the_supported_list(tmp_path):
    p = tmp_path / "mamba.gguf"
    write_gguf(p, "mamba", {"token_embd.weight": (np.zeros((8, 32), np.float32), None)})
    r = reflex("generate", "hi", "--model", str(p), "--backend", "cpu")
    one_line_error(r, UnsupportedModelError.exit_code, "unsupported architecture 'mamba'")
    assert "qwen3" in r.stderr and "gemma3" in r.stderr


def test_unsupported_quantization_is_named(tmp_path):
    import gguf

    p = tmp_path / "q2k.gguf"
    q2k = np.zeros((4, 84), np.uint8)  # 4 rows of one Q2_K block (256 weights, 84 bytes)
    write_gguf(p, "qwen3", {"token_embd.weight": (q2k, gguf.GGMLQuantizationType.Q2_K)})
    one_line_error(reflex("generate", "hi", "--model", str(p), "--backend", "cpu"), UnsupportedModelError.exit_code,
                   "unsupported quantization type Q2_K")


def test_bad_request_values(tmp_path):
    r = reflex("generate", "hi", "--backend", "cpu", "--temperature", "-1")
    one_line_error(r, RequestError.exit_code, "temperature")
    r = reflex("generate", "hi", "--backend", "cpu", "--max-tokens", "0")
    one_line_error(r, RequestError.exit_code, "max_tokens")


def test_doctor_reports_without_a_gpu():
    r = reflex("doctor", "--json")
    assert r.returncode == 0, r.stderr

    info = json.loads(r.stdout)
    assert info["python"] and info["backend_auto"] in ("cpu", "cuda")
    if info["gpu"] is None:
        assert info["gpu_error"]  # says why


def test_install_without_nvcc_warns_and_succeeds(monkeypatch, capsys):
    import build_kernels

    monkeypatch.setattr(build_kernels, "find_nvcc", lambda: None)
    build_kernels.build_for_install()
    err = capsys.readouterr().err
    assert "WARNING: nvcc not found" in err and "reflex doctor" in err
    assert err.count("WARNING") == 1


@pytest.mark.parametrize("argv, needle", [
    ([], "required: COMMAND"), (["system1", "hi"], "required: --candidate"), (["frobnicate"], "invalid choice"),
    (["generate", "hi", "--max-tokens", "many"], "argument --max-tokens/-n: invalid int value: 'many'"),
    (["generate", "hi", "--colour"], "unrecognized arguments: --colour"),
    # the idle sampling runs before doctor answers: NaN, infinite or long spans are refused
    (["doctor", "--idle-seconds", "nan"], "in [0, 60]"), (["doctor", "--idle-seconds", "1e9"], "in [0, 60]"),
])
def test_usage_errors_are_one_line_exit_2(argv, needle):
    """The usage is for --help; an error is one line that names the problem and where help is."""
    r = reflex(*argv)
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("reflex: error: "), r.stderr
    assert needle in r.stderr and "--help" in r.stderr and "usage:" not in r.stderr


def test_help_still_prints_the_usage():
    r = reflex("generate", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: reflex generate")


def test_version():
    from reflex_runtime import __version__

    r = reflex("--version")
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, f"reflex-runtime {__version__}", "")


def _generate_tiny(fixture_paths, *args, stdin=None, input=None):
    gguf = str(fixture_paths("gemma3", "f32").gguf)
    return subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", *args, "-n", "3", "--backend", "cpu",
                           "--model", gguf, "--json"], capture_output=True, text=True,
                          env=ENV, timeout=300, stdin=stdin, input=input)


def test_a_prompt_from_stdin_with_dash_or_a_pipe(fixture_paths):
    want = _generate_tiny(fixture_paths, "The capital of France is", stdin=subprocess.DEVNULL)
    assert want.returncode == 0, want.stderr
    text = json.loads(want.stdout)["text"]
    for args in (["-"], []):
        r = _generate_tiny(fixture_paths, *args, input="The capital of France is\n")  # echo's newline is dropped
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["text"] == text and out["record"]["prompt_tokens"] == json.loads(want.stdout)["record"]["prompt_tokens"]


@pytest.mark.parametrize("data, needle", [(b"", "the prompt on stdin is empty"), (b"\n\n", "the prompt on stdin is empty"),
                                          (b"caf\xe9", "the prompt on stdin is not UTF-8 (byte 3)")])
def test_a_bad_prompt_on_stdin_is_one_line(data, needle):
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "-", "--backend", "cpu"], input=data,
                       capture_output=True, env=ENV, timeout=60)
    assert r.returncode == RequestError.exit_code and r.stdout == b""
    assert r.stderr.decode().strip() == f"reflex: error: {needle}"


def test_an_oversized_prompt_on_stdin_is_refused_without_reading_it_all():
    from reflex_runtime.engine import Limits

    most = Limits().max_prompt_chars * 4
    r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "system1", "-c", "x", "--backend", "cpu"],
                       input=b"a" * (most + 2), capture_output=True, env=ENV, timeout=60)
    assert r.returncode == RequestError.exit_code
    assert r.stderr.decode().strip() == f"reflex: error: the prompt on stdin has more than {most} bytes"


def test_no_prompt_on_a_terminal_is_a_usage_error():
    """Left out with stdin a terminal, nothing is waited for: a one-line usage error."""
    import pty

    parent, child = pty.openpty()
    try:
        r = subprocess.run([sys.executable, "-m", "reflex_runtime.cli", "generate", "--backend", "cpu"], stdin=child,
                           capture_output=True, text=True, env=ENV, timeout=60)
    finally:
        os.close(child)
        os.close(parent)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("reflex: error: the following arguments are required: prompt (or '-'")
    assert r.stderr.count("\n") == 1


def test_unwritable_record_path_is_one_line_after_the_answer(tmp_path):
    r = reflex("generate", "The capital of France is", "-n", "1", "--backend", "cpu",
               "--record", str(tmp_path / "no" / "such" / "dir" / "rec.json"))
    assert r.returncode == RequestError.exit_code
    assert r.stdout.strip()  # the answer went out before the record failed: nothing lost
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("reflex: error: cannot write the record to --record")


def test_early_device_start_reads_backend_like_argparse(monkeypatch):
    """generate/system1 start cuInit before argparse runs, so the CLI reads --backend itself:
    every spelling argparse accepts must keep a CPU run off the GPU."""
    from reflex_runtime.cli import _backend_in_argv, build_parser

    monkeypatch.delenv("REFLEX_BACKEND", raising=False)
    for argv in (["generate", "p", "--backend", "cpu"], ["generate", "p", "--backend=cpu"], ["generate", "p", "--back", "cpu"],
                 ["system1", "p", "-c", "x", "--b=cpu"], ["generate", "p", "--backend", "cuda", "--backend", "cpu"]):
        assert _backend_in_argv(argv) == "cpu", argv
        assert build_parser().parse_args(argv).backend == "cpu", argv
    assert _backend_in_argv(["generate", "p"]) == "auto"
    monkeypatch.setenv("REFLEX_BACKEND", "cpu")
    assert _backend_in_argv(["generate", "p"]) == "cpu"


@pytest.mark.parametrize("argv, needle", [
    (["generate", "hi", "--ctx", "-1"], "argument --ctx: must be an integer in [16, 1048576], got '-1'"),
    (["generate", "hi", "--ctx", "0"], "argument --ctx: must be an integer in [16, 1048576], got '0'"),
    (["generate", "hi", "--ctx", "1000000000"], "argument --ctx: must be an integer in [16, 1048576], got '1000000000'"),
    (["serve", "--ctx", "10^9"], "argument --ctx: must be an integer in [16, 1048576], got '10^9'"),
    (["generate", "hi", "--model", ""], "argument --model/-m: must not be empty (leave --model out for $REFLEX_MODEL "
                                        "or the embedded model)"),
    (["stdio", "-m", " "], "argument --model/-m: must not be empty"),
    (["serve", "--request-timeout", "-1"], "argument --request-timeout: must be a number of seconds in [0, 86400]"),
    (["uds", "/tmp/x.sock", "--idle-timeout", "nan"], "argument --idle-timeout: must be a number of seconds"),
    (["bench", "m.gguf", "--prefill-breakdown", "-3"], "argument --prefill-breakdown: must be 0 (skip) or an integer "
                                                        "in [16, 1048576], got '-3'"),
    (["bench", "m.gguf", "--prefill-breakdown", "5"], "argument --prefill-breakdown: must be 0 (skip)"),
])
def test_bad_option_values_are_usage_errors(argv, needle, capsys):
    from reflex_runtime.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_option_values_exit_2_from_the_command():
    r = reflex("generate", "hi", "--ctx", "0", "--backend", "cpu", timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "argument --ctx: must be an integer in [16, 1048576], got '0'" in r.stderr
def test_chat_on_a_model_without_a_template_says_so(fixture_paths):
    """`--chat` on a base model (this Gemma 3 fixture has no chat template): one notice line on
    stderr, then the continuation, and the record names the fallback."""
    gguf = str(fixture_paths("gemma3", "f32").gguf)
    r = reflex("generate", "Hi", "--chat", "-n", "2", "--backend", "cpu", "--model", gguf, "--json")
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if "no chat template" in line]
    assert len(notes) == 1 and notes[0].startswith("reflex: ") and "--model smollm2" in notes[0]
    rec = json.loads(r.stdout)["record"]
    assert rec["chat_template"] == "none (plain Gemma turn fallback)" and rec["notice"] in notes[0]
    r = reflex("generate", "Hi", "-n", "2", "--backend", "cpu", "--model", gguf)
    assert r.returncode == 0 and "chat template" not in r.stderr


def test_a_prompt_past_the_default_bound_fits_the_context_asked_for(fixture_paths):
    """The request layer's prompt bound (8,192 tokens) rises to `--ctx` when that is larger: every
    front end's engine takes it from its context (engine.context_limits), and the CLI's stdin bound too."""
    from reflex_runtime.engine import Limits, context_limits

    base = Limits()
    assert context_limits(base, 4096) is base and context_limits(base, 8192) is base
    assert context_limits(base, 32768).max_prompt_tokens == 32768
    assert context_limits(Limits(max_prompt_tokens=100), 32768).max_prompt_tokens == 100  # a bound someone set stays
    prompt = "x y " * 2150  # 8,601 tokens in this vocabulary
    r = _generate_tiny(fixture_paths, "-", "--ctx", "9000", input=prompt)
    assert r.returncode == 0, r.stderr
    n = json.loads(r.stdout)["record"]["prompt_tokens"]
    assert 8192 < n <= 9000 - 3, n
    r = _generate_tiny(fixture_paths, "-", input=prompt)
    assert r.returncode == RequestError.exit_code
    assert r.stderr.strip().endswith(f"prompt has {n} tokens, the limit is 8192"), r.stderr
