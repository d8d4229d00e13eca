"""The one runner of the oracle suites, and what each of them needs to run zaya. Standard library only, so that
the suites that need no torch (tokenizers, chat templates, serve) start without it; common.py builds the
torch-side helpers (models, references) on top of this module.

A suite makes a Suite, counts its checks with Suite.check, runs its parts through Suite.run (an exception in a
part is one failed check with its traceback, and the next part still runs), and ends with Suite.finish: the line
`<suite>: N passed, N failed` that tests/run_all.sh reads, exit status 1 when a check failed.

Environment:
  ZAYA_BIN   command used instead of <repo>/build/zaya (split with shlex), e.g.
             ZAYA_BIN="python tests/oracle/fake_zaya.py" runs the model suites against an HF-backed stand-in.
"""
import argparse
import contextlib
import fnmatch
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

# Read by the Hugging Face libraries when they are imported, so set here: the suites import this module first.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
warnings.filterwarnings("ignore")

REPO_ROOT = Path(__file__).resolve().parents[2]
ZAYA_DEFAULT = REPO_ROOT / "build" / "zaya"


# ----------------------------------------------------------------------------------------------
# the binary


class ZayaMissing(RuntimeError):
    pass


def zaya_cmd():
    """The command prefix that runs zaya (list of strings). Raises ZayaMissing with a clear message."""
    env = os.environ.get("ZAYA_BIN")
    if env:
        return shlex.split(env)
    if not ZAYA_DEFAULT.is_file() or not os.access(ZAYA_DEFAULT, os.X_OK):
        raise ZayaMissing(f"{ZAYA_DEFAULT} not found or not executable: build it first (`make` in {REPO_ROOT}),"
                          " or point ZAYA_BIN at a zaya command")
    return [str(ZAYA_DEFAULT)]


def _as(data, text):
    # TimeoutExpired holds bytes or None whatever `text` the run asked for
    data = data or b""
    if text:
        return data.decode(errors="replace") if isinstance(data, bytes) else data
    return data.encode() if isinstance(data, str) else data


def run_zaya(args, timeout=300, text=True, input=None, threads=2):
    """Runs zaya with the given argument list, in the repository root, OMP_NUM_THREADS set to `threads` unless the
    environment sets it. Returns (returncode, stdout, stderr): text, or bytes with text=False (token bytes need not
    be UTF-8). A timeout gives returncode 124 with the output so far and a note on stderr; a command that cannot
    start gives 127."""
    cmd = zaya_cmd() + [str(a) for a in args]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    try:
        p = subprocess.run(cmd, capture_output=True, text=text, input=input, timeout=timeout, cwd=str(REPO_ROOT),
                           env=env)
    except subprocess.TimeoutExpired as e:
        note = f"\n[oracle] timeout after {timeout}s: {' '.join(cmd)}"
        return 124, _as(e.stdout, text), _as(e.stderr, text) + _as(note, text)
    except OSError as e:
        return 127, _as(b"", text), _as(str(e), text)
    return p.returncode, p.stdout, p.stderr


def write_file(path, data):
    """Writes text (as UTF-8) or bytes to path; returns path, to hand on to zaya."""
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


# ----------------------------------------------------------------------------------------------
# the runner


class Suite:
    """One suite's checks: counted, printed, summed up by finish().

    print_passes: print every check, a passing one with its detail too (the tokenizer suites' details are
    measurements); without it a detail says why a check failed and only failures are printed, under the suite's
    own progress lines."""

    def __init__(self, name, print_passes=False):
        self.name = name
        self.print_passes = print_passes
        self.passed = 0
        self.failed = 0
        self.only = None
        self.keep = None
        self.started = time.time()

    @property
    def count(self):
        return self.passed + self.failed

    def parse_args(self, parser=None, parts=None, keep=False):
        """The command line: parser's options (the suite's own), plus --only where the suite's parts can be picked
        (`parts` says what they are, for --help): comma-separated part names or shell patterns (`--only cfg3,cfg7`,
        `--only '*gemma*'`); and, with keep, --keep DIR: work_dir() writes there and leaves the files."""
        parser = parser or argparse.ArgumentParser()
        if parts:
            parser.add_argument("--only", metavar="NAMES",
                                help=f"run only these parts: comma-separated {parts} or shell patterns")
        if keep:
            parser.add_argument("--keep", metavar="DIR", help="write the work files here and keep them")
        args = parser.parse_args()
        if getattr(args, "only", None):
            self.only = args.only.split(",")
        self.keep = getattr(args, "keep", None)
        return args

    @contextlib.contextmanager
    def work_dir(self, prefix):
        """The suite's work folder, absolute (zaya runs in the repository root): --keep DIR (made if need be and
        left in place) or a new temporary folder, removed at the end."""
        path = Path(self.keep).resolve() if self.keep else Path(tempfile.mkdtemp(prefix=prefix))
        path.mkdir(parents=True, exist_ok=True)
        try:
            yield path
        finally:
            if not self.keep:
                shutil.rmtree(path, ignore_errors=True)

    def check(self, ok, name, detail=""):
        ok = bool(ok)
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        if self.print_passes or not ok:
            print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}", flush=True)
        return ok

    def selected(self, part):
        """Whether --only keeps this part (without --only, every part)."""
        return self.only is None or any(fnmatch.fnmatchcase(part, pattern) for pattern in self.only)

    def run(self, part, fn, *args, **kwargs):
        """fn(*args, **kwargs) unless --only leaves `part` out. An exception in it is one failed check,
        '<part> ran to the end', with its traceback on stderr; the suite goes on with its next part."""
        if not self.selected(part):
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a crash in one part is one failed check
            traceback.print_exc()
            sys.stderr.flush()
            self.check(False, f"{part} ran to the end", repr(e))
            return None

    def require_zaya(self):
        """Says which zaya the suite runs; without one: one failed check, and the suite ends."""
        try:
            print("zaya:", " ".join(zaya_cmd()), flush=True)
        except ZayaMissing as e:
            print(f"{self.name}: cannot run: {e}", file=sys.stderr, flush=True)
            self.check(False, "zaya binary", str(e))
            self.finish()

    def finish(self):
        """The time taken and the summary line tests/run_all.sh reads; exits 1 when a check failed, else 0."""
        print(f"time {time.time() - self.started:.1f}s", flush=True)
        print(f"{self.name}: {self.passed} passed, {self.failed} failed", flush=True)
        sys.exit(1 if self.failed else 0)
