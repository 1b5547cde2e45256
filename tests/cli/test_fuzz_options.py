"""Option fuzzing: every command's declared options and arguments, drawn by hypothesis and
run in this process through ``gpubench.cli.app.main``, must end with a known exit code and one line of
error, never a traceback.

The argument lists are built from each click command's ``params`` (net's subcommands included), so
an option added later is fuzzed without touching this file. Values mix sizes, numbers (negative,
zero, huge, nan), comma lists of the words the commands accept, garbage and unicode; options repeat.

What would start a long run is kept short: net's -t/-O only tiny or refused values, net client
only to a closed loopback port, net server stopped as soon as it listens, merge -t cpu only with an
option it refuses (no Dask cluster starts), scheduler addresses only ones that fail at once. The
GPU commands are fuzzed only where no GPU is visible (with a GPU they would measure); there, valid
options must end with the one no-GPU line, exit 2.

Invariants checked on every example:
- exit code in {0, 1, 2, 3, 130};
- no "Traceback" in stdout or stderr, and no exception reached main()'s catch-all for bugs (its
  line says "run with --debug for the traceback");
- exit 1, 2 or 3: stderr is exactly one line, starting "gpubench".
"""

from __future__ import annotations

import io
import os
import signal
import socket
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import click
import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpubench.cli.app import main  # noqa: E402
from gpubench.core.registry import plugins  # noqa: E402
from gpubench.core.gpu import gpu_available  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
EXAMPLE_TOML = str(ROOT / "src" / "gpubench" / "profiles" / "h200x2.toml")
RESULTS = [str(DATA / n) for n in ("copy-pinned-h200.json", "nccl-h200x2.json", "batch-h200.json")]
COPY_RESULTS = [str(DATA / n) for n in ("copy-pinned-h200.json", "copy-all-h200.json")]

# Commands that need a GPU for anything but bad input ("suite" without --check, "merge" -t gpu).
GPU_COMMANDS = ("copy", "p2p", "nccl", "merge", "batch", "memcpy2d", "overlap", "pin", "suite")
BUG_LINE = "run with --debug for the traceback"
NO_GPU_LINE = "no CUDA device is visible"

HAVE_GPU = gpu_available()


def _closed_port() -> int:
    """A loopback TCP port nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


CLOSED_PORT = str(_closed_port())

# ---------------------------------------------------------------------------------------------
# value strategies
# ---------------------------------------------------------------------------------------------

WORDS = ("h2d", "d2h", "d2d", "bidir", "pinned", "pageable", "write-combined", "registered", "separate", "packed",
         "batched-api", "contiguous", "2d", "row-loop", "cupy-slice", "write", "read", "sm", "latency", "off",
         "off-bidir", "off-latency", "all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce",
         "all-to-all", "send-recv", "float", "half", "int8", "bfloat16", "sum", "prod", "avg", "min", "max",
         "tcp", "ucx", "cpu", "gpu", "GB", "GiB", "iqr", "range", "0", "1", "-1", "4x", "1x")
SIZES = ("1", "16", "4KiB", "4kib", "1M", "64KB", "30GB", "1GiB", "1T", "1.5K", "0.5", "0.5K", "4096B", "0B",
         "1KiB,64KiB", "4KiB,4KiB", "3KiB", "64MiB", "65MiB", "9" * 30 + "T", "9" * 400, "1" + "0" * 25)
NUMBERS = ("0", "-0", "1", "2", "4", "-1", "-5", "0.5", "1.0000001", "1e3", "1e309", "-1e309", "nan", "inf", "-inf",
           "1_000", "0x10", "2147483648", "9223372036854775808", "-9223372036854775809", "9" * 400, "1e-320",
           "\u0661\u0662", "\u0661.\u0665", "\uff11\uff12", "1e400", "-1e400", "3601", "604801", " 7 ", "+3")
GARBAGE = ("", " ", ",", ",,", "abc", "ü", "日本語", "\u202e", "💥", "-", "a,b", "0,0", "-1,0", "0,,1",
           ",".join(map(str, range(40))), "1 2", "'", '"', "\\", "%s", "{}", "\t", "x" * 300, "0" * 300,
           "\udcff", "[::1", "tcp://", "ucx://x", "tcp://[::1")
TEXT = st.text(alphabet=st.characters(blacklist_characters="\x00/", blacklist_categories=("Cs",)), max_size=12)
CSV = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(",".join)
ANY_STRING = st.one_of(st.sampled_from(SIZES), st.sampled_from(NUMBERS), st.sampled_from(GARBAGE), CSV, TEXT,
                       st.integers(-(2**70), 2**70).map(str))
INTS = st.one_of(st.integers(-3, 10).map(str), st.integers(-(2**70), 2**70).map(str), st.sampled_from(NUMBERS),
                 st.sampled_from(GARBAGE))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(repr), st.sampled_from(NUMBERS),
                   st.sampled_from(GARBAGE))
# Paths relative to the workspace folder the tests run in: nothing is written elsewhere.
OUT_PATHS = st.one_of(st.sampled_from(["out.json", "out.png", "nodir/out.json", "nodir/out.png", ".", "", "a-folder",
                                       "out.txt", "out-link.json", "file/inside.json"]),
                      TEXT.filter(lambda s: s.strip() not in ("", ".", "..")).map(lambda s: "w-" + s))
IN_PATHS = st.one_of(st.sampled_from(RESULTS + [EXAMPLE_TOML, "garbage.json", "empty.json", "array.json", "a-folder",
                                                "missing.json", "broken-link.json", "", ".", "bad.toml", "a-fifo",
                                                "/dev/zero", "/dev/null"]), TEXT)


def _choice(p: click.Parameter):
    return st.one_of(st.sampled_from(list(p.type.choices)), st.sampled_from(GARBAGE), TEXT)


def _generic(p: click.Parameter):
    t = p.type
    if isinstance(t, click.Choice):
        return _choice(p)
    if isinstance(t, click.types.IntParamType):
        return INTS
    if isinstance(t, click.types.FloatParamType):
        return FLOATS
    if isinstance(t, click.Path):
        writes = p.name in ("json_path", "output", "out_dir")
        return OUT_PATHS if writes else IN_PATHS
    return ANY_STRING


SHORT_SECONDS = st.sampled_from(["0.1", "0.15", "0", "-1", "-0.1", "nan", "inf", "3601", "1e9", "x", ""])
SHORT_OMIT = st.sampled_from(["0", "0.05", "-1", "601", "nan", "inf", "3600", "x"])
# (command path, param name) -> values allowed there (keeps runs short and hosts loopback-only)
OVERRIDES = {
    ("net local", "seconds"): SHORT_SECONDS,
    ("net client", "seconds"): SHORT_SECONDS,
    ("net local", "omit"): SHORT_OMIT,
    ("net client", "omit"): SHORT_OMIT,
    ("net local", "streams"): st.sampled_from(["1", "2", "8", "0", "-1", "129", "x", "1e3"]),
    ("net client", "port"): st.sampled_from([CLOSED_PORT, "0", "-1", "65536", "x", ""]),
    ("net client", "host"): st.sampled_from(["127.0.0.1", "localhost", "::1", "", " ", "no-such-host.invalid",
                                             "a" * 70 + ".com", "a..b", "[::1]", "127.0.0.1:80", "日本語", "-"]),
    ("net server", "bind"): st.sampled_from(["127.0.0.1", "::1", "localhost", "", "999.1.1.1", "a" * 70 + ".com",
                                             "a..b", "no-such-host.invalid", "日本語", "[::1]"]),
    ("net server", "port"): st.sampled_from(["0", CLOSED_PORT, "-1", "65536", "x", ""]),
    ("merge", "merge_type"): st.sampled_from(["gpu", "cpu", "CPU", "", "x"]),
    # compare and plot: saved results half the time, so the options after loading are reached too
    ("compare", "base"): st.one_of(st.sampled_from(COPY_RESULTS), IN_PATHS),
    ("compare", "new"): st.one_of(st.sampled_from(COPY_RESULTS), IN_PATHS),
    ("plot", "results"): st.one_of(st.sampled_from(RESULTS), IN_PATHS),
    ("plot", "output"): st.one_of(st.just("out.png"), OUT_PATHS),
    ("report", "inputs"): st.one_of(st.sampled_from(RESULTS), IN_PATHS),
    ("report", "output"): st.one_of(st.just("out.html"), OUT_PATHS),
    ("merge", "scheduler_address"): st.sampled_from(["abc", "", "tcp://", "ucx://x", "[::1"]),
    ("merge", "scheduler_file"): st.sampled_from(["missing.json", "a-folder", "", "nodir/x.json", "a-fifo",
                                                  "garbage.json"]),
    ("nccl", "scheduler_address"): st.sampled_from(["abc", "", "tcp://", "[::1"]),
    ("nccl", "scheduler_file"): st.sampled_from(["missing.json", "a-folder", "garbage.json", "empty.json", "",
                                                 "nodir/x.json", "a-fifo", "/dev/zero"]),
}
# net client / local: a 10 s test by default; plot: -o is required. These go first, so a drawn
# value still wins.
PREPEND = {"net local": ["-t", "0.1"], "net client": ["-t", "0.1", "-p", CLOSED_PORT], "plot": ["-o", "out.png"],
           "report": ["-o", "out.html"]}
# A merge -t cpu would start a Dask cluster: append one option MergeSpec refuses, so none starts.
MERGE_CPU_REFUSED = st.sampled_from([["--runs", "0"], ["--threads-per-worker", "0"], ["--timeout", "0"],
                                     ["--warmup-runs", "-1"], ["-d", "0,0"], ["-d", "-1"]])
EXTRAS = st.sampled_from([[]] * 10 + [["--help"], ["--nosuch"], ["stray"], ["--json"], ["--"], ["-x"]])


def _targets() -> dict[str, click.Command]:
    out = {}
    from gpubench.core.registry import load_command

    for name in plugins():
        cmd = load_command(name)
        if isinstance(cmd, click.Group):
            for sub, sc in cmd.commands.items():
                out[f"{name} {sub}"] = sc
        else:
            out[name] = cmd
    return out


TARGETS = _targets()


def argv_strategy(path: str, cmd: click.Command):
    """Argument lists for ``cmd`` drawn from its declared params (--debug left out: it shows tracebacks)."""
    def value(p):
        if (path, p.name) in OVERRIDES:
            return OVERRIDES[(path, p.name)]
        default = p.default
        if default is None or callable(default) or isinstance(default, (bool, tuple, list)) or \
                type(default).__name__ == "Sentinel":
            return _generic(p)
        # the default half the time, so later options are reached past the first check
        return st.one_of(st.just(str(default)), _generic(p))

    def option(p: click.Option):
        names = st.sampled_from(list(p.opts) + list(p.secondary_opts))
        if p.is_flag:
            return names.map(lambda n: [n])
        return st.tuples(names, value(p)).map(list)

    opts = [option(p) for p in cmd.params if isinstance(p, click.Option) and p.name != "debug"]
    positional = []
    for p in cmd.params:
        if isinstance(p, click.Argument):
            n = ((1 if p.required else 0), 3) if p.nargs == -1 else (0, 1) if not p.required else (1, 1)
            positional.append(st.lists(value(p), min_size=n[0], max_size=n[1]))
    pos = st.tuples(*positional).map(lambda ls: [x for lst in ls for x in lst]) if positional else st.just([])
    options = st.lists(st.one_of(opts), max_size=8).map(lambda ls: [x for lst in ls for x in lst])

    @st.composite
    def build(draw):
        argv = [*path.split(), *PREPEND.get(path, []), *draw(pos), *draw(options), *draw(EXTRAS)]
        if path == "merge" and _last_value(argv, ("-t", "--type")) == "cpu":
            argv += draw(MERGE_CPU_REFUSED)
        return argv

    return build()


def _last_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    v = None
    for a, b in zip(argv, argv[1:]):
        if a in names:
            v = b
    return v


# ---------------------------------------------------------------------------------------------
# running and the invariants
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder to run in, holding the files the path strategies name; cwd for the module."""
    ws = tmp_path_factory.mktemp("fuzz")
    (ws / "garbage.json").write_bytes(b"\x89PNG\x00\xff{garbage")
    (ws / "empty.json").write_bytes(b"")
    (ws / "array.json").write_text("[1, 2, 3]")
    (ws / "bad.toml").write_text("[[expect]\nname = ")
    (ws / "a-folder").mkdir()
    (ws / "file").write_text("a file, not a folder")
    (ws / "broken-link.json").symlink_to(ws / "no-such-target")
    (ws / "out-link.json").symlink_to(ws / "nodir" / "target.json")
    os.mkfifo(ws / "a-fifo")  # nobody writes to it: opening it must not wait for a writer
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(ws)
        yield ws


class Hung(BaseException):
    """Raised by SIGPROF in an example that ran too long (a BaseException: main() lets it through)."""


def _alarm(signum, frame):
    raise Hung(f"no exit within {EXAMPLE_LIMIT_S} s of CPU time")


# CPU seconds (ITIMER_PROF: this process's user + system time), so a loaded host, where an example's
# few CPU seconds stretch to tens of wall seconds, does not look like a hang; an example blocked
# without spinning is pytest-timeout's (pyproject.toml), which fails the test with its stack.
EXAMPLE_LIMIT_S = 20


def invoke(argv: list[str]) -> tuple[int, str, str]:
    """Run gpubench in this process; return (exit code, stdout, stderr). Raises Hung after 20 CPU s."""
    out, err = io.StringIO(), io.StringIO()
    code: object = None
    old = signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, EXAMPLE_LIMIT_S)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main(list(argv))
            except SystemExit as e:
                code = e.code
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    return code, out.getvalue(), err.getvalue()


def check_invariants(argv: list[str], code, out: str, err: str) -> None:
    where = f"argv={argv!r}\nexit={code!r}\nstdout={out[-2000:]!r}\nstderr={err[-2000:]!r}"
    assert code in (0, 1, 2, 3, 130), where
    assert "Traceback" not in out and "Traceback" not in err, where
    assert BUG_LINE not in err, "an unexpected exception reached main()'s catch-all\n" + where
    if code in (1, 2, 3):
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpubench"), where


def stop_server_at_once(monkeypatch) -> None:
    """`net server` with valid options would serve forever: stop it as soon as it listens."""
    from gpubench.plugins.net import server as net

    orig = net.NetServer.serve_forever

    def serve_once(self, max_tests=None):
        self.stop()
        return orig(self, max_tests)

    monkeypatch.setattr(net.NetServer, "serve_forever", serve_once)
    from gpubench.plugins.net import ucx_server

    # --protocol ucx: its server, once listening, serves no test (0 of 0)
    monkeypatch.setattr(ucx_server.UcxServer, "serve_forever", lambda self, max_tests=None, parent_fd=None: None)


FUZZ_SETTINGS = settings(max_examples=120, deadline=None, derandomize=False, print_blob=True,
                         suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                HealthCheck.function_scoped_fixture])
SLOW = {"plot": 30, "report": 20, "net local": 30, "env": 60}


@pytest.mark.parametrize("path", list(TARGETS))
def test_fuzzed_options_never_trace_back(path, workspace, monkeypatch):
    if HAVE_GPU and path.split()[0] in GPU_COMMANDS:
        pytest.skip("a GPU is visible: fuzzing would start real measurements")
    if path == "net server":
        stop_server_at_once(monkeypatch)
    cmd = TARGETS[path]

    @settings(FUZZ_SETTINGS, max_examples=SLOW.get(path, 120))
    @given(argv_strategy(path, cmd))
    def run(argv):
        code, out, err = invoke(argv)
        check_invariants(argv, code, out, err)
        if path.split()[0] in GPU_COMMANDS and path != "suite":
            # no GPU here: only --help succeeds; anything else is bad input or the no-GPU line
            assert code in (0, 2), (argv, code, err)
            assert code == 2 or "--help" in argv, (argv, code, out, err)

    run()


# ---------------------------------------------------------------------------------------------
# valid options of the GPU commands: the one no-GPU line, exit 2
# ---------------------------------------------------------------------------------------------


def _subset(words):
    return st.lists(st.sampled_from(words), min_size=1, max_size=len(words), unique=True).map(",".join)


def _sized_pair():
    ordered = ["1", "4KiB", "1M", "64MiB", "1GiB", "4GB", "1T"]
    return st.tuples(st.integers(0, 6), st.integers(0, 6)).map(
        lambda ij: ["-b", ordered[min(ij)], "-e", ordered[max(ij)]])


def _opt(name, values):
    return st.sampled_from(values).map(lambda v: [name, str(v)])


def _flag(name):
    return st.just([name])


TIMING = [_opt("-w", [0, 1, 3]), _opt("-n", [1, 2, 10]), _opt("--min-time", ["0.01", "0.5", "2"])]
COMMON = [_opt("--units", ["GB", "GiB"]), _flag("-q"), _opt("--json", ["out.json"])]

# command -> (keyed fragments: each key at most once, so no two fragments contradict)
VALID = {
    "copy": {
        "mem": st.one_of(_flag("--pinned"), _flag("--pageable"),
                         _subset(["pinned", "pageable", "write-combined", "registered"]).map(lambda v: ["-m", v])),
        "dir": _subset(["h2d", "d2h", "bidir"]).map(lambda v: ["--direction", v]),
        "sizes": _sized_pair(), "f": _opt("-f", ["2", "4", "1.5", "10"]), "d": _opt("-d", ["0", "1", "0,1", "3,2,1,0"]),
        "verify": _flag("--verify"), "cap": _opt("--max-pinned", ["1GiB", "64GB"]),
        "spread": _opt("--spread", ["iqr", "range"]),
    },
    "p2p": {
        "d": _opt("-d", ["0,1", "1,0", "0,1,2,3"]),
        "t": _subset(["write", "read", "bidir", "sm", "latency", "off", "off-bidir", "off-latency"]).map(
            lambda v: ["-t", v]),
        "b": _opt("-b", ["4KiB", "64MiB", "1GiB"]), "lat": _opt("--latency-bytes", ["16", "4", "64"]),
        "loop": _opt("--loop-count", [1, 4, 16]), "verify": st.sampled_from([["--verify"], ["--no-verify"]]),
        "spread": _opt("--spread", ["none", "iqr", "range"]),
    },
    "nccl": {
        "coll": st.sampled_from(["all-reduce", "all-gather", "reduce-scatter", "broadcast", "reduce", "all-to-all",
                                 "send-recv"]).map(lambda v: [v]),
        "d": _opt("-d", ["0", "0,1", "1,0"]), "sizes": _sized_pair(), "f": _opt("-f", ["2", "4"]),
        "t": _opt("-t", ["int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
                         "bfloat16"]),
        "o": _opt("-o", ["sum", "prod", "max", "min", "avg"]), "r": _opt("-r", [0]), "w": _opt("-w", [0, 1, 5]),
        "n": _opt("-n", [1, 20]), "s": _opt("--samples", [1, 5]), "c": _opt("-c", [0, 1]),
        "p": _opt("--placement", ["both", "out-of-place", "in-place"]), "T": _opt("-T", ["0", "10", "300"]),
        "x": _opt("--expect-busbw", ["1", "100.5"]),
    },
    "batch": {
        "shape": st.sampled_from([["--count", "16", "--piece", "4KiB"], ["--sweep"], ["--piece", "1KiB,64KiB"],
                                  ["--total", "16MiB", "--piece", "4KiB,64KiB"], ["--count", "1"]]),
        "s": _subset(["separate", "packed", "batched-api", "contiguous"]).map(lambda v: ["-s", v]),
        "dir": _subset(["h2d", "d2h"]).map(lambda v: ["--direction", v]),
        "m": _subset(["pinned", "pageable"]).map(lambda v: ["-m", v]), "d": _opt("-d", [0, 1]),
        "gate": _flag("--no-gate"), "spread": _opt("--spread", ["iqr", "range"]),
    },
    "memcpy2d": {
        "shape": st.sampled_from([["-W", "4096", "-H", "64"], ["--sweep"], ["-W", "64,1KiB"],
                                  ["--total", "4MiB", "-W", "256,4KiB"], ["-W", "1", "-H", "1"]]),
        "sp": _opt("--src-pitch", ["4x", "1x", "2x"]), "dp": _opt("--dst-pitch", ["1x", "2x"]),
        "s": _subset(["2d", "row-loop", "contiguous", "cupy-slice"]).map(lambda v: ["-s", v]),
        "dir": _subset(["h2d", "d2h", "d2d"]).map(lambda v: ["--direction", v]),
        "m": _subset(["pinned", "pageable"]).map(lambda v: ["-m", v]), "d": _opt("-d", [0, 2]),
        "gate": _flag("--no-gate"), "spread": _opt("--spread", ["iqr", "range"]),
    },
    "overlap": {
        "size": _opt("--size", ["1MiB", "16MiB", "256MiB"]),
        "work": st.one_of(_subset(["0", "64", "1024", "4096"]).map(lambda v: ["--work", v]), _flag("--sweep")),
        "k": st.sampled_from([["--streams", "1"], ["--streams", "4", "--chunks", "8"], ["--streams", "2"]]),
        "d": _opt("-d", [0, 1]),
    },
    "merge": {
        "t": _opt("-t", ["gpu"]), "d": _opt("-d", ["0", "0,1"]), "p": _opt("-p", ["tcp", "ucx", "ucxx"]),
        "c": _opt("-c", ["1000", "1_000_000"]), "bc": _opt("--base-chunks", [1, 4]),
        "oc": _opt("--other-chunks", [1, 4]), "fm": _opt("--frac-match", ["0.3", "1"]),
        "join": st.sampled_from([["--broadcast-join"], ["--shuffle-join"]]),
        "sm": _opt("--shuffle-method", ["tasks", "p2p", "disk"]), "ns": _flag("--no-shuffle"), "si": _flag("-s"),
        "rmm": st.sampled_from([["--rmm-pool-size", "1GB"], ["--rmm-pool-size", "0.5"], ["--rmm-async"],
                                ["--disable-rmm-pool"]]),
        "spill": _flag("--enable-cudf-spill"), "tpw": _opt("--threads-per-worker", [1, 2]),
        "runs": _opt("--runs", [1, 3]), "wr": _opt("--warmup-runs", [0, 1]),
        "ign": _opt("--ignore-size", ["0", "1MiB"]), "to": _opt("--timeout", ["5", "600"]),
    },
    "suite": {
        "o": _opt("-o", [".", "a-folder"]), "e": _opt("--expect", [EXAMPLE_TOML]), "m": _flag("--merge"),
        "s": _flag("--strict"),
    },
}


def valid_argv(name: str):
    frags = VALID[name]
    extra = [] if name == "suite" else [*TIMING, *COMMON] if name not in ("p2p", "nccl", "merge") else COMMON
    keyed = [f.map(lambda t, k=k: (k, t)) for k, f in frags.items()]
    keyed += [f.map(lambda t, i=i: (f"x{i}", t)) for i, f in enumerate(extra)]
    return st.lists(st.one_of(keyed), max_size=8, unique_by=lambda kt: kt[0]).map(
        lambda kts: [name, *[x for _, t in kts for x in t]])


@pytest.mark.skipif(HAVE_GPU, reason="a GPU is visible: valid options would start real measurements")
@pytest.mark.parametrize("name", list(VALID))
def test_valid_options_without_gpu_give_the_no_gpu_line(name, workspace):
    @settings(FUZZ_SETTINGS, max_examples=50)
    @given(valid_argv(name))
    def run(argv):
        code, out, err = invoke(argv)
        check_invariants(argv, code, out, err)
        assert code == 2 and NO_GPU_LINE in err, (argv, code, out, err)

    run()
