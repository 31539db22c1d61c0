"""Mutation fuzzer for the router's parsers; run by hand (pytest does not collect it).

    python -m tests.fuzz.run_fuzz --inputs 1000000             # split evenly over every target
    python -m tests.fuzz.run_fuzz --inputs 20000 --targets endpoints,tls_peek --seed 3
    python -m tests.fuzz.run_fuzz --engine atheris --inputs 200000   # coverage-guided, if installed
    python -m tests.fuzz.run_fuzz --targets initial_native --inputs 50000 --save-corpus tests/fuzz/corpus

The default engine needs nothing beyond the test dependencies and no coverage: it starts
from real inputs (``tests/fuzz/targets_*.py``), stacks byte flips, inserts, deletes,
repeats, splices, dictionary tokens and integer/varint (length-field) tweaks, and keeps a
mutant when it produces an outcome (an error message shape, a result kind) not seen yet;
``--save-corpus`` also writes each such mutant there as ``<target>-<sha1>.bin`` (the native
targets read theirs back from ``tests/fuzz/corpus/`` as seeds).

Each target runs in its own worker process, one at a time (one core). Before running an
input the worker writes it to a small shared file, so an input that kills the interpreter
(a segfault in a C extension) or hangs it is still saved: the coordinator records it and
restarts the worker. New crashes (Python ones minimised first) are saved as
``tests/fuzz/crashes/<target>--<signature>--<sha1>.bin``; the regression tests replay them.
Exit status 0 when no crash signature outside ``--known`` was found, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import mmap
import os
import random
import re
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.fuzz.registry import TARGETS
from tests.fuzz.target import CRASHES_DIR, FuzzTarget

STATE_HEADER = struct.Struct("<QI")
"""Shared-file header: index of the input being run, its length; the input follows."""
STATE_BYTES = STATE_HEADER.size + max(t.max_len for t in TARGETS.values())
HANG_S = 20.0
"""A worker that has not moved to its next input for this long is stuck: killed, input saved."""
MAX_RESTARTS = 20
MINIMISE_RUNS = 3000
MINIMISE_FORKS = 40
MAX_CORPUS = 2000
INTERESTING_BYTES = (0x00, 0x01, 0x03, 0x16, 0x3F, 0x40, 0x7F, 0x80, 0xC0, 0xFF)
INTERESTING_INTS = (
    0, 1, 2, 0x3F, 0x40, 0x7F, 0x80, 0xFF, 0x100, 0x3FFF, 0x4000, 0x7FFF, 0xFFFF, 0x10000, 0x4000_0000,
    0xFFFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, (1 << 62) - 1,
)


# ---------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------
class Mutator:
    """Stacked byte-level mutations of one corpus entry (bounded by the target's max_len)."""

    def __init__(self, rng: random.Random, dictionary: tuple[bytes, ...], max_len: int) -> None:
        self.rng = rng
        self.dictionary = dictionary or (b"\x00",)
        self.max_len = max_len
        self.ops: tuple[Callable[[bytearray, list[bytes]], bytearray], ...] = (
            self._flip, self._byte, self._insert_random, self._insert_token, self._insert_token,
            self._repeat, self._delete, self._duplicate, self._splice, self._truncate,
            self._int_tweak, self._int_tweak, self._varint, self._swap,
        )

    def mutate(self, data: bytes, corpus: list[bytes]) -> bytes:
        buf = bytearray(data)
        for _ in range(1 + min(7, int(self.rng.expovariate(0.7)))):
            buf = self.rng.choice(self.ops)(buf, corpus)
        return bytes(buf[: self.max_len])

    def _pos(self, buf: bytearray, extra: int = 0) -> int:
        return self.rng.randrange(len(buf) + extra) if len(buf) + extra > 0 else 0

    def _range(self, buf: bytearray) -> tuple[int, int]:
        start = self._pos(buf)
        size = self.rng.choice((1, 2, 4, 8, 16, 64, 512, 4096))
        return start, min(len(buf), start + self.rng.randint(1, size))

    def _flip(self, buf: bytearray, _: list[bytes]) -> bytearray:
        if buf:
            buf[self._pos(buf)] ^= 1 << self.rng.randrange(8)
        return buf

    def _byte(self, buf: bytearray, _: list[bytes]) -> bytearray:
        if buf:
            rng = self.rng
            buf[self._pos(buf)] = rng.choice(INTERESTING_BYTES) if rng.random() < 0.5 else rng.randrange(256)
        return buf

    def _insert_random(self, buf: bytearray, _: list[bytes]) -> bytearray:
        pos = self._pos(buf, 1)
        buf[pos:pos] = self.rng.randbytes(self.rng.randint(1, 16))
        return buf

    def _insert_token(self, buf: bytearray, _: list[bytes]) -> bytearray:
        token = self.rng.choice(self.dictionary)
        pos = self._pos(buf, 1)
        end = pos + (len(token) if self.rng.random() < 0.3 else 0)  # overwrite or insert
        buf[pos:end] = token
        return buf

    def _repeat(self, buf: bytearray, _: list[bytes]) -> bytearray:
        """A short chunk repeated 2 to thousands of times: deep nesting, long runs, many frames."""
        if not buf:
            return buf
        start = self._pos(buf)
        chunk = bytes(buf[start : start + self.rng.randint(1, 8)])
        room = max(0, self.max_len - len(buf)) // len(chunk)
        times = min(room, int(2 ** self.rng.uniform(1, 16)))
        buf[start:start] = chunk * times
        return buf

    def _delete(self, buf: bytearray, _: list[bytes]) -> bytearray:
        start, end = self._range(buf)
        del buf[start:end]
        return buf

    def _duplicate(self, buf: bytearray, _: list[bytes]) -> bytearray:
        start, end = self._range(buf)
        pos = self._pos(buf, 1)
        buf[pos:pos] = buf[start:end]
        return buf

    def _splice(self, buf: bytearray, corpus: list[bytes]) -> bytearray:
        other = self.rng.choice(corpus)
        cut = self._pos(buf, 1)
        return buf[:cut] + other[self.rng.randrange(len(other) + 1) :]

    def _truncate(self, buf: bytearray, _: list[bytes]) -> bytearray:
        return buf[: self._pos(buf, 1)]

    def _int_tweak(self, buf: bytearray, _: list[bytes]) -> bytearray:
        """Treat 1-4 bytes as a big-endian length and nudge it, or set it to an edge value."""
        width = self.rng.choice((1, 2, 2, 3, 4))
        if len(buf) < width:
            return buf
        pos = self.rng.randrange(len(buf) - width + 1)
        value = int.from_bytes(buf[pos : pos + width], "big")
        roll = self.rng.random()
        if roll < 0.5:
            value += self.rng.choice((-1, 1)) * self.rng.randint(1, 35)
        elif roll < 0.8:
            value = self.rng.choice(INTERESTING_INTS)
        else:
            value = len(buf) - pos - width + self.rng.randint(-2, 2)
        buf[pos : pos + width] = (value % (1 << (8 * width))).to_bytes(width, "big")
        return buf

    def _varint(self, buf: bytearray, _: list[bytes]) -> bytearray:
        """Write a QUIC varint (1, 2, 4 or 8 bytes, maybe non-minimal) over or into the input."""
        value = self.rng.choice(INTERESTING_INTS) + self.rng.randint(-1, 1)
        size = self.rng.choice((1, 2, 4, 8))
        value %= 1 << (8 * size - 2)
        encoded = (value | ((size.bit_length() - 1) << (8 * size - 2))).to_bytes(size, "big")
        pos = self._pos(buf, 1)
        buf[pos : pos + (size if self.rng.random() < 0.5 else 0)] = encoded
        return buf

    def _swap(self, buf: bytearray, _: list[bytes]) -> bytearray:
        a, b = sorted((self._range(buf), self._range(buf)))
        if a[1] <= b[0]:
            buf[:] = buf[: a[0]] + buf[b[0] : b[1]] + buf[a[1] : b[0]] + buf[a[0] : a[1]] + buf[b[1] :]
        return buf


# ---------------------------------------------------------------------------
# Outcomes, signatures, crash files
# ---------------------------------------------------------------------------
PROJECT_DIRS = ("/quic/", "/router/", "/discovery/", "/tests/fuzz/")


def signature(exc: BaseException) -> str:
    """Type plus the innermost project function it came from: stable across runs and line moves."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if any(d in f.filename for d in PROJECT_DIRS)] or frames
    where = f"{Path(ours[-1].filename).stem}.{ours[-1].name}" if ours else "unknown"
    detail = ""
    if type(exc).__name__ == "FuzzInvariantError":
        detail = "-" + re.sub(r"\d+", "N", str(exc))[:40]
    return _slug(f"{type(exc).__name__}{detail}@{where}")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", text)[:90]


def _label(exc: BaseException) -> str:
    """The shape of an error message: digits and quoted text blanked, first line, 60 characters."""
    message = str(exc).split("\n", 1)[0]
    message = re.sub(r"'[^']*'|\"[^\"]*\"|0x[0-9a-fA-F]+|[0-9]+", "#", message)
    return f"{type(exc).__name__}:{message[:60]}"


def crash_path(directory: Path, target: str, sig: str, data: bytes) -> Path:
    return directory / f"{target}--{sig}--{hashlib.sha1(data).hexdigest()[:12]}.bin"


def known_signatures(directory: Path) -> set[tuple[str, str]]:
    """(target, signature) of every saved crash file in ``directory``."""
    out = set()
    for path in directory.glob("*--*--*.bin"):
        target, sig, _ = path.stem.split("--")
        out.add((target, sig))
    return out


def run_one(target: FuzzTarget, data: bytes) -> tuple[str, BaseException | None]:
    """(outcome label, the exception if it is a crash) of one input."""
    try:
        return "ok:" + target.run(data), None
    except target.allowed as exc:
        return _label(exc), None
    except Exception as exc:
        return "crash", exc


def python_signature(target: FuzzTarget) -> Callable[[bytes], str | None]:
    def signature_of(data: bytes) -> str | None:
        _, exc = run_one(target, data)
        return None if exc is None else signature(exc)

    return signature_of


def forked_signature(target: FuzzTarget) -> Callable[[bytes], str | None]:
    """Runs each input in a forked child: how it died (``signal-N``), for crashes that kill."""

    def signature_of(data: bytes) -> str | None:
        pid = os.fork()
        if pid == 0:  # the child: run, then leave without cleanup
            os._exit(0 if run_one(target, data)[1] is None else 3)
        _, status = os.waitpid(pid, 0)
        return f"signal-{os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else None

    return signature_of


def minimise(signature_of: Callable[[bytes], str | None], data: bytes, sig: str, budget: int) -> bytes:
    """Greedy chunk removal while the same crash signature reproduces."""
    best, chunk, runs = data, max(1, len(data) // 2), 0
    while chunk >= 1 and runs < budget:
        pos = 0
        while pos < len(best) and runs < budget:
            candidate = best[:pos] + best[pos + chunk :]
            runs += 1
            if signature_of(candidate) == sig:
                best = candidate
            else:
                pos += chunk
        chunk //= 2
    return best


# ---------------------------------------------------------------------------
# Worker: one target, in its own process
# ---------------------------------------------------------------------------
def worker(name: str, inputs: int, seed: int, state: Path, crashes: Path, known: set[tuple[str, str]],
           save_corpus: Path | None = None) -> dict:
    """Fuzz one target for ``inputs`` inputs; new Python crashes are minimised and saved, and each
    input with a new outcome is written to ``save_corpus`` if given."""
    target = TARGETS[name]
    rng = random.Random(seed)
    seeds = [s[: target.max_len] for s in target.seeds()]
    corpus = list(seeds)
    mutator = Mutator(rng, target.dictionary, target.max_len)
    seen: set[str] = set()
    found: dict[str, str] = {}
    repeats = 0
    mutator_failed = False
    with open(state, "r+b") as f:
        shared = mmap.mmap(f.fileno(), STATE_BYTES)
    started = time.perf_counter()
    for index in range(inputs):
        parent = rng.choice(corpus)
        data = None
        if target.structured is not None and rng.random() < 0.5:
            try:
                data = target.structured(parent, rng)
            except Exception as exc:  # a bug of the mutator, not of the parser: say so, go on
                if not mutator_failed:
                    print(f"structured mutator of {name} failed: {exc!r}", file=sys.stderr, flush=True)
                mutator_failed = True
        if data is None:
            data = mutator.mutate(parent, corpus)
        data = data[: target.max_len]
        shared[: STATE_HEADER.size] = STATE_HEADER.pack(index, len(data))
        shared[STATE_HEADER.size : STATE_HEADER.size + len(data)] = data
        label, exc = run_one(target, data)
        if exc is not None:
            sig = signature(exc)
            if sig in found or (name, sig) in known:
                repeats += 1
                continue
            small = minimise(python_signature(target), data, sig, MINIMISE_RUNS)
            path = crash_path(crashes, name, sig, small)
            path.write_bytes(small)
            found[sig] = path.name
            print(f"crash in {name}: {sig} -> {path}", file=sys.stderr, flush=True)
            continue
        if label not in seen:
            seen.add(label)
            if save_corpus is not None:
                (save_corpus / f"{name}-{hashlib.sha1(data).hexdigest()[:12]}.bin").write_bytes(data)
            if len(corpus) < MAX_CORPUS:
                corpus.append(data)
            else:
                corpus[rng.randrange(len(seeds), MAX_CORPUS)] = data
    elapsed = time.perf_counter() - started
    return {"target": name, "inputs": inputs, "seconds": round(elapsed, 3), "corpus": len(corpus),
            "outcomes": len(seen), "new_crashes": sorted(found.values()), "known_crash_hits": repeats}


def _read_state(state: Path) -> tuple[int, bytes]:
    raw = state.read_bytes()
    index, length = STATE_HEADER.unpack_from(raw)
    return index, raw[STATE_HEADER.size : STATE_HEADER.size + length]


# ---------------------------------------------------------------------------
# Coordinator
# ---------------------------------------------------------------------------
def coordinate(names: list[str], inputs: int, seed: int, crashes: Path, known_dir: Path,
               save_corpus: Path | None = None) -> list[dict]:
    crashes.mkdir(parents=True, exist_ok=True)
    known = known_signatures(known_dir) | known_signatures(crashes)
    share, extra = divmod(inputs, len(names))
    results = []
    with tempfile.TemporaryDirectory(prefix="fuzz-state-") as tmp:
        state = Path(tmp) / "state"
        for position, name in enumerate(names):
            want = share + (1 if position < extra else 0)
            result = {"target": name, "inputs": 0, "seconds": 0.0, "new_crashes": [], "known_crash_hits": 0,
                      "restarts": 0}
            wall = time.perf_counter()
            while result["inputs"] < want and result["restarts"] <= MAX_RESTARTS:
                state.write_bytes(bytes(STATE_BYTES))
                outcome = _run_worker(name, want - result["inputs"], seed * 7919 + result["restarts"], state,
                                      crashes, known_dir, save_corpus)
                if isinstance(outcome, dict):
                    for key in ("inputs", "seconds", "known_crash_hits"):
                        result[key] += outcome[key]
                    result["new_crashes"] += outcome["new_crashes"]
                    result["corpus"], result["outcomes"] = outcome["corpus"], outcome["outcomes"]
                    known |= {(name, n.split("--")[1]) for n in outcome["new_crashes"]}
                    continue
                index, data = _read_state(state)  # the worker died on this input
                result["inputs"] += index + 1
                result["restarts"] += 1
                sig = outcome
                if (name, sig) in known:
                    result["known_crash_hits"] += 1
                else:
                    if sig.startswith("signal-"):
                        data = minimise(forked_signature(TARGETS[name]), data, sig, MINIMISE_FORKS)
                    path = crash_path(crashes, name, sig, data)
                    path.write_bytes(data)
                    known.add((name, sig))
                    result["new_crashes"].append(path.name)
                    print(f"crash in {name}: {sig} -> {path}", file=sys.stderr, flush=True)
            result["wall_seconds"] = round(time.perf_counter() - wall, 3)
            result["inputs_per_s"] = round(result["inputs"] / max(result["wall_seconds"], 1e-9))
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def _run_worker(name: str, inputs: int, seed: int, state: Path, crashes: Path, known: Path,
                save_corpus: Path | None = None) -> dict | str:
    """The worker's stats, or the signature of how it died (``signal-N``, ``exit-N``, ``hang``)."""
    cmd = [sys.executable, "-m", "tests.fuzz.run_fuzz", "--worker", name, "--inputs", str(inputs),
           "--seed", str(seed), "--state", str(state), "--crashes", str(crashes), "--known", str(known)]
    if save_corpus is not None:
        cmd += ["--save-corpus", str(save_corpus)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    last_index, last_move = -1, time.monotonic()
    while True:
        try:
            out, _ = proc.communicate(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            index, _ = _read_state(state)
            if index != last_index:
                last_index, last_move = index, time.monotonic()
            elif time.monotonic() - last_move > HANG_S:
                proc.kill()
                proc.communicate()
                return "hang"
    if proc.returncode == 0 and out.strip():
        return dict(json.loads(out.strip().splitlines()[-1]))
    return f"signal-{-proc.returncode}" if proc.returncode < 0 else f"exit-{proc.returncode}"


# ---------------------------------------------------------------------------
# atheris (coverage-guided, optional)
# ---------------------------------------------------------------------------
def atheris_worker(name: str, inputs: int, corpus: Path, artifacts: Path) -> None:
    import atheris

    target = TARGETS[name]

    def one_input(data: bytes) -> None:
        with contextlib.suppress(target.allowed):
            target.run(data)

    atheris.instrument_all()
    atheris.Setup(
        [sys.argv[0], f"-runs={inputs}", f"-max_len={target.max_len}", f"-artifact_prefix={artifacts}/{name}-",
         "-timeout=20", "-rss_limit_mb=4096", str(corpus)],
        one_input,
    )
    atheris.Fuzz()


def coordinate_atheris(names: list[str], inputs: int, crashes: Path) -> list[dict]:
    share = inputs // len(names)
    results = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{name}-") as tmp:
            corpus, artifacts = Path(tmp) / "corpus", Path(tmp) / "artifacts"
            corpus.mkdir()
            artifacts.mkdir()
            for i, seed in enumerate(TARGETS[name].seeds()):
                (corpus / f"seed-{i}").write_bytes(seed)
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "tests.fuzz.run_fuzz", "--atheris-worker", name, "--inputs", str(share),
                 "--state", str(corpus), "--crashes", str(artifacts)],
                capture_output=True, text=True, check=False,
            )
            done = re.search(r"Done (\d+) runs", proc.stderr)
            saved = []
            for artifact in artifacts.iterdir():
                data = artifact.read_bytes()
                path = crash_path(crashes, name, "atheris-" + artifact.name.split("-")[-2], data)
                path.write_bytes(data)
                saved.append(path.name)
            wall = time.perf_counter() - started
            runs = int(done[1]) if done else 0
            result = {"target": name, "engine": "atheris", "inputs": runs, "wall_seconds": round(wall, 3),
                      "inputs_per_s": round(runs / wall), "new_crashes": saved}
            if saved:
                print(proc.stderr[-3000:], file=sys.stderr)
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.run_fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000, help="total inputs, split over the targets")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated subset of {list(TARGETS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", choices=("mutate", "atheris"), default="mutate")
    parser.add_argument("--crashes", type=Path, default=CRASHES_DIR, help="where new crash inputs are saved")
    parser.add_argument("--known", type=Path, default=CRASHES_DIR, help="crash signatures already known")
    parser.add_argument("--json", type=Path, help="also write the per-target results here")
    parser.add_argument("--save-corpus", type=Path, help="write each input with a new outcome here")
    parser.add_argument("--reaching-c", action="store_true",
                        help="only the targets that run C code when the extensions are built (tests/sanitize/run)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--atheris-worker", help=argparse.SUPPRESS)
    parser.add_argument("--state", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        stats = worker(args.worker, args.inputs, args.seed, args.state, args.crashes,
                       known_signatures(args.known) | known_signatures(args.crashes), args.save_corpus)
        print(json.dumps(stats), flush=True)
        return 0
    if args.atheris_worker:
        atheris_worker(args.atheris_worker, args.inputs, args.state, args.crashes)
        return 0
    names = [n for n in args.targets.split(",") if n]
    if args.reaching_c:
        names = [n for n in names if n in TARGETS and TARGETS[n].reaches_c]
    if args.save_corpus is not None:
        args.save_corpus.mkdir(parents=True, exist_ok=True)
    unknown = [n for n in names if n not in TARGETS]
    if unknown or not names or args.inputs < len(names):
        parser.error(f"targets must be a non-empty subset of {list(TARGETS)} with >= 1 input each")
    if args.engine == "atheris":
        results = coordinate_atheris(names, args.inputs, args.crashes)
    else:
        results = coordinate(names, args.inputs, args.seed, args.crashes, args.known, args.save_corpus)
    total = sum(r["inputs"] for r in results)
    wall = sum(r["wall_seconds"] for r in results)
    new = [c for r in results for c in r["new_crashes"]]
    print(f"total: {total} inputs in {wall:.1f} s over {len(results)} targets; new crashes: {len(new)}")
    if args.json:
        args.json.write_text(json.dumps({"total_inputs": total, "wall_seconds": wall, "targets": results}, indent=2))
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
