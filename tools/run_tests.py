"""Run nox's sessions in parallel lanes, print each session's log as it ends, then every session's time.

    python3 tools/run_tests.py            # README command 2: what `nox` runs, in two lanes at a time
    python3 tools/run_tests.py --serial   # one lane, as `nox` runs them

The machine has 2 cores: one lane runs the real-server suites (SGLang before vLLM, so the vLLM suite compares
its ids with SGLang's records), the other everything else. Most sessions spend much of their time installing,
which overlaps well. A session's log is printed whole when it ends, so the lanes' lines never interleave.
Exits non-zero when a session failed; warns when the whole run passed the time budget.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BUDGET_S = 45 * 60  # the CI time budget (the hard limit is 90 minutes)

SERVERS = ["integration_sglang", "integration_vllm"]  # one lane of their own, in this order


def _lanes() -> list[list[str]]:
    """The real-server suites, and every other session nox runs by default (noxfile's order)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import nox

    import noxfile  # noqa: F401 - sets nox.options.sessions

    sessions = list(nox.options.sessions or [])
    missing = [s for s in SERVERS if s not in sessions]
    if missing:
        raise SystemExit(f"noxfile.py runs no {', '.join(missing)}: update SERVERS in {__file__}")
    return [SERVERS, [s for s in sessions if s not in SERVERS]]


_print_lock = threading.Lock()


def _run_lane(sessions: list[str], logs: Path, results: dict[str, tuple[float, int]]) -> None:
    for session in sessions:
        log = logs / f"{session}.log"
        started = time.monotonic()
        with log.open("wb") as sink:
            code = subprocess.call([sys.executable, "-m", "nox", "-s", session], stdout=sink, stderr=subprocess.STDOUT)
        elapsed = time.monotonic() - started
        results[session] = (elapsed, code)
        with _print_lock:
            status = "passed" if code == 0 else f"FAILED (exit {code})"
            print(f"\n===== nox -s {session}: {status} in {elapsed / 60:.1f} min =====", flush=True)
            sys.stdout.buffer.write(log.read_bytes())
            sys.stdout.flush()


def main() -> int:
    """Run the lanes; returns the exit status (1 when a session failed)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serial", action="store_true", help="one lane, in nox's default order")
    args = parser.parse_args()
    lanes = _lanes()
    if args.serial:
        lanes = [lanes[1] + lanes[0]]
    logs = Path(tempfile.mkdtemp(prefix="tito-ci-"))
    results: dict[str, tuple[float, int]] = {}
    started = time.monotonic()
    threads = [threading.Thread(target=_run_lane, args=(lane, logs, results)) for lane in lanes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.monotonic() - started
    print("\n===== session times =====")
    for lane_number, lane in enumerate(lanes, 1):
        lane_s = sum(results[s][0] for s in lane if s in results)
        print(f"lane {lane_number} ({lane_s / 60:.1f} min):")
        for session in lane:
            elapsed, code = results.get(session, (0.0, -1))
            print(f"  {session:<22} {elapsed / 60:6.1f} min  {'ok' if code == 0 else 'FAILED'}")
    print(f"total wall time {total / 60:.1f} min (budget {BUDGET_S / 60:.0f} min; logs in {logs})")
    if total > BUDGET_S:
        print(f"WARNING: the run took {total / 60:.1f} min, over the {BUDGET_S / 60:.0f}-minute CI budget")
    failed = [s for s, (_, code) in results.items() if code != 0]
    if failed:
        print(f"failed sessions: {', '.join(failed)}")
    print(f"sessions: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
