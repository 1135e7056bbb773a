#!/usr/bin/env python3
"""Build the test fixtures a whole `pytest` run asks for, beside that run.

A first run on an empty test cache converts ~80 tiny models (about 7 minutes on the 2-core
development VM) one at a time, each when a test first needs it, while the second core idles.
tests/conftest.py starts this script in the background of a whole-suite run (plain `pytest`, no
paths given; REFLEX_TEST_PREBUILD=0 turns it off) so those conversions happen ahead of the tests
that need them, in the order they need them. It builds through fixtures.make_fixture, whose
per-fixture file locks make a test that wants a fixture being built here wait for it rather than
build it twice; a fixture already cached costs a stat.

    python scripts/prebuild_fixtures.py [LIST]                 # build LIST (default tests/fixture_list.json)
    python scripts/prebuild_fixtures.py --write LIST RECORD    # LIST from a recorded run (first use first)

A run records every fixture asked for with REFLEX_RECORD_FIXTURES=RECORD (fixtures/cache.py appends a
JSON line per call, from any process); a list that lags behind the tests only costs time: a
fixture it lacks is built when a test asks, one it has too many is built for nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
DEFAULT_LIST = _HERE.parent / "tests" / "fixture_list.json"
KEYS = ("arch", "outtype", "seed", "overrides")


def write_list(record: Path, out: Path) -> int:
    """The distinct fixtures of a record, in the order they were first asked for."""
    seen, entries = set(), []
    for line in record.read_text().splitlines():
        e = {k: json.loads(line)[k] for k in KEYS}
        key = json.dumps(e, sort_keys=True)
        if key not in seen:
            seen.add(key)
            entries.append(e)
    out.write_text("[\n" + ",\n".join(json.dumps(e, sort_keys=True) for e in entries) + "\n]\n")
    return len(entries)


class Stop:
    """SIGTERM, or the test run that started us gone: finish the fixture in hand, then stop
    (a fixture is renamed into place only when complete, so nothing half-built is left)."""

    def __init__(self, parent: int):
        self.parent, self.asked = parent, False
        signal.signal(signal.SIGTERM, self._ask)

    def _ask(self, *_):
        self.asked = True

    def __call__(self) -> bool:
        return self.asked or os.getppid() != self.parent


def build(entries: list[dict], make, stop=lambda: False, log=print) -> int:
    """make(arch, outtype, seed, **overrides) for each entry until stop(); returns how many it built
    or found. A fixture that fails here is left to the test that needs it (which reports it)."""
    done = 0
    for e in entries:
        if stop():
            log("stopped")
            break
        t = time.monotonic()
        try:
            make(e["arch"], e["outtype"], e["seed"], **e["overrides"])
            done += 1
            log(f"{time.monotonic() - t:6.1f} s  {e['arch']} {e['outtype']} {e['overrides']}")
        except Exception as err:  # noqa: BLE001 - the test that needs it will raise it properly
            log(f"failed: {e['arch']} {e['outtype']} {e['overrides']}: {type(err).__name__}: {err}")
    return done


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"] and len(argv) == 3:
        print(f"{write_list(Path(argv[2]), Path(argv[1]))} fixtures -> {argv[1]}")
        return 0
    if len(argv) > 1 or argv[:1] == ["--write"]:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    sys.path.insert(0, str(_HERE))
    from fixtures import make_fixture

    entries = json.loads(Path(argv[0] if argv else DEFAULT_LIST).read_text())
    os.nice(10)  # the tests come first
    t0 = time.monotonic()
    n = build(entries, make_fixture, Stop(os.getppid()), log=lambda m: print(m, flush=True))
    print(f"{n} of {len(entries)} fixtures ready in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
