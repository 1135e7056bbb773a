"""The cold path: from a model reference to a ready Engine, every stage marked on the timeline.

With the CUDA backend possible, the device comes up on a background thread (cuInit, context,
fatbin, NVML) while this thread opens the GGUF and builds the tokenizer; weights stream to the
GPU on their own threads while the prompt is encoded. See docs/INTERNALS.md.
"""

from __future__ import annotations

import os
import sys

from .measure.coldstart import Timeline
from .errors import BadSetting, DeviceError, DoesNotFit, ReflexError

BACKENDS = ("auto", "cuda", "cpu")


def resolve_model(ref: str | None, log=None) -> str:
    """A path, `org/repo:file.gguf`, `org/repo:QUANT`, `org/repo`, a short name (pypi_models.py:
    `smollm2`), or None for the embedded model (see is_local_path for how a path is told from a
    Hub reference)."""
    ref = ref or os.environ.get("REFLEX_MODEL") or None
    if ref is None:
        from .modelfile.embedded import embedded_model_path

        return embedded_model_path()
    from .modelfile.pypi_models import is_short_name

    if is_short_name(ref) and not os.path.exists(ref):
        from .modelfile.pypi_models import model_path

        return model_path(ref, log=log)
    if is_local_path(ref):
        return os.path.expanduser(ref)  # GGUFFile says "not found" or "not a regular file"
    from .modelfile.hub import resolve_model_ref

    return resolve_model_ref(ref)


def is_local_path(ref: str) -> bool:
    """Whether a model reference names a local file rather than a Hub repo: anything that exists,
    anything absolute or explicitly relative (`/`, `.`, `~`), a `.gguf` name without a Hub
    selector (`models/x.gguf`, `x.gguf`: a Hub file is always `org/repo:file.gguf`), and
    anything that is not a Hub reference at all."""
    if os.path.lexists(ref) or ref.startswith(("/", ".", "~")):
        return True
    if ":" not in ref and ref.lower().endswith(".gguf"):
        return True
    from .modelfile.hub import looks_like_ref

    return not looks_like_ref(ref)


def write_index(path: str) -> bool:
    """Parse a GGUF and write its model index now (modelfile/modelcache.py), so that its first cold
    start skips the parse and builds no tokenizer dict: `reflex pull` and the container image's
    build do this. False when the file does not parse or the index cannot be written."""
    from .modelfile import modelcache
    from .modelfile.gguf_file import GGUFFile
    from .text.tokenizer import Tokenizer

    try:
        with GGUFFile(path) as g:
            return modelcache.save(path, g, Tokenizer.from_gguf(g))
    except ReflexError:
        return False


def _page_cache_cold(path: str, tl: Timeline) -> bool:
    from .modelfile.pagecache import resident_fraction

    frac = resident_fraction(path)
    tl.page_cache_resident = frac
    return frac is not None and frac < 0.9


def _prefetch(gguf) -> None:
    """With a cold page cache, start reading the model file as soon as its directory is read, so
    the disk reads overlap CUDA initialisation instead of following it. A MoE file whose experts
    go up on demand reads only its base ahead: the upload reads each expert when a forward asks
    for it, or behind the first forward, and a whole-file read ahead would compete with that."""
    from .gpu.residency import on_demand_enabled, plan_upload
    from .modelfile.pagecache import prefetch

    plan = plan_upload(gguf) if on_demand_enabled() else None
    prefetch(gguf.path, ranges=None if plan is None else [(gguf.data_offset + a, n) for a, n in plan.base])


def load_engine(model_ref: str | None = None, backend: str = "auto", timeline: Timeline | None = None,
                max_context: int | None = None, log=None, device=None, limits=None, max_seqs: int | None = None,
                kv_tokens: int | None = None):
    """Build an Engine. `log(msg)` receives one-line notices (e.g. the CPU fallback and why).
    `device`: a gpu.bootstrap.DeviceBootstrap the caller already started on `timeline`.
    `limits`: the engine.Limits requests are held to (default: Limits()).
    `max_seqs`: sequences the runner holds at once for the scheduler (`--parallel`; serving front
    ends pass engine.DEFAULT_PARALLEL when it is not given; default 1: one-shot generation, 8 on
    the CPU). `kv_tokens`: the paged KV cache's pool they share (kvpool.py; `--kv-tokens`); not
    given, the CUDA runner sizes it for max_seqs sequences of max_context tokens, or what fits in
    the free GPU memory (and logs it), and the CPU runner holds max_seqs * max_context.
    A model that does not fit at all raises DoesNotFit (no fallback to the CPU).
    On failure the timeline's `failed_stage` names the stage that raised: resolve_model,
    open_model, load_weights, tokenizer or engine."""
    if backend not in BACKENDS:
        raise ReflexError(f"unknown backend '{backend}' (choose from {', '.join(BACKENDS)})")
    # While several threads bring the model up, a thread that drops the GIL for a driver call
    # or a read must get it back quickly, not after the default 5 ms slice of another thread.
    # The load creates ~10^6 long-lived objects (vocabulary, tables): collecting them on the way
    # costs tens of ms for nothing, so the collector pauses, and the survivors are frozen out of
    # later collections.
    import gc

    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    gc_was_on = gc.isenabled()
    gc.disable()
    tl = timeline or Timeline()
    try:
        return _load(model_ref, backend, tl, max_context, log, device, limits, max_seqs, kv_tokens)
    except BaseException:
        tl.fail()
        raise
    finally:
        sys.setswitchinterval(switch)
        gc.freeze()
        if gc_was_on:
            gc.enable()


def _load(model_ref, backend, tl, max_context, log, device, limits, max_seqs, kv_tokens):
    tl.begin("resolve_model")
    if backend in ("auto", "cuda"):
        if device is None:  # first: cuInit is the cold path's longest stage
            from .gpu.bootstrap import DeviceBootstrap

            device = DeviceBootstrap.start(tl)
    else:
        device = None
        tl.no_energy("backend cpu: the GPU is not used")
    from .engine import Engine
    from .modelfile.gguf_file import GGUFFile
    from .families import read_config

    log = log or (lambda msg: print(f"reflex: {msg}", file=sys.stderr))

    path = resolve_model(model_ref, log)
    cold = os.path.isfile(path) and _page_cache_cold(path, tl)
    tl.mark("model_resolved")
    tl.begin("open_model")
    from .modelfile import modelcache

    index = modelcache.load(path) if os.path.isfile(path) else None
    gguf = GGUFFile(path, index=index["gguf"] if index else None)
    config = read_config(gguf)
    if cold:
        _prefetch(gguf)
    tl.mark("gguf_open")

    tl.begin("load_weights")
    runner = None
    fallback_reason = None
    if device is not None:
        from .families import gpu_model_class, gpu_unsupported  # no driver import: an unsupported file falls back cheaply

        why_not = gpu_unsupported(config, gguf)
        if why_not is None:
            from .gpu.runner import CudaRunner

            # Starts the weight upload; it waits for the device thread and runs beside us.
            runner = CudaRunner.start(device, gguf, config, tl, gpu_model_class(config), max_context=max_context,
                                      max_seqs=max_seqs or 1, kv_tokens=kv_tokens)
        else:
            fallback_reason = why_not  # the device threads finish on their own; nothing waits

    tl.begin("tokenizer")
    from .text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(gguf)
    if index:
        tokenizer.adopt_tables(index.get("tokenizer") or {})
    tokenizer.prepare()  # build the lookup tables now, while the weights stream to the GPU
    tl.mark("tokenizer")

    tl.begin("load_weights")
    if runner is not None:
        try:
            runner.wait_ready()
        except DeviceError as e:
            if backend == "cuda" or isinstance(e, (DoesNotFit, BadSetting)):
                raise
            fallback_reason, runner = str(e), None
        if runner is not None and runner.fit_note:
            log(runner.fit_note)
    elif device is not None and fallback_reason is None:
        fallback_reason = device.error
    if runner is None:
        if backend == "cuda":
            raise DeviceError(f"the CUDA backend cannot run this model: {fallback_reason}")
        if backend == "auto" and fallback_reason:
            log(f"using the CPU reference backend: {fallback_reason}")
        from .families import load_reference
        from .reference.runner import ReferenceRunner

        runner = ReferenceRunner(load_reference(gguf, config), max_context=max_context, max_seqs=max_seqs or 8,
                                 kv_tokens=kv_tokens)
        tl.mark("weights_loaded")
        if device is None or not getattr(device, "energy_started", False):
            if tl.meter is None:
                tl.no_energy(fallback_reason or "no GPU in use")
    # Nothing reads the file mapping from here on (weights went to the GPU through preadv, and the
    # CPU reference reads with pread): unmap it, so a file truncated under a long-lived process
    # can only give a ModelFileError on a later read, never a SIGBUS (docs/INTERNALS.md).
    gguf.release_mapping()
    tl.begin("engine")
    return Engine(gguf, config, tokenizer, runner, timeline=tl, model_ref=model_ref or path, limits=limits,
                  fallback_reason=fallback_reason, index_cached=index is not None)
