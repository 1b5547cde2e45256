"""The registry: every command, its plug-in, its one-line help and whether it needs a GPU.

Pure data, imported by ``gpubench --help``: no command module, CuPy or Dask is imported here (a
command's module is imported only when it runs or its help is shown; click's "Lazily Loading
Subcommands"). Adding a benchmark is one module under ``gpubench/bench/``, one command module
under ``gpubench/commands/`` and one line below (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    """One command.

    Attributes:
        name: the command's name on the command line.
        module: the import path of its click command: a module defining ``command``, or a plug-in
            module declaring ``OPTIONS``, ``build_spec``, ``format_report`` and ``HELP``, from which
            the command is generated (``gpubench.cli.load_command``).
        help: one line for ``gpubench --help``.
        gpu: "yes" (needs a visible GPU), "no" (never does), or the form that works without one
            ("merge -t cpu"), listed in the no-GPU error.
    """

    name: str
    module: str
    help: str
    gpu: str = "yes"


ENTRIES: tuple[Entry, ...] = (
    Entry("copy", "gpubench.commands.copy", "Host<->device copy bandwidth: pinned vs pageable, H2D, D2H, bidir."),
    Entry("env", "gpubench.commands.env", "The machine: GPUs, driver, CUDA, PCIe, NVLink, topology, NUMA.", "no"),
    Entry("p2p", "gpubench.commands.p2p", "GPU<->GPU copy matrix: peer access on/off, read/write, bidir, SM copy, latency."),
    Entry("nccl", "gpubench.commands.nccl", "NCCL collectives (all-reduce, all-gather, ...): algbw and busbw as nccl-tests."),
    Entry("merge", "gpubench.commands.merge", "Dask(-CUDA) cuDF merge over tcp or ucx: dask-cuda's local_cudf_merge.",
          "merge -t cpu"),
    Entry("net", "gpubench.commands.net", "Multi-stream TCP throughput between two hosts (server, client, local).", "no"),
    Entry("batch", "gpubench.commands.batch", "Many small copies vs packed vs cudaMemcpyBatchAsync vs one contiguous copy."),
    Entry("memcpy2d", "gpubench.commands.memcpy2d",
          "Pitched 2-D copies vs a row-by-row loop vs one contiguous copy vs CuPy slices."),
    Entry("overlap", "gpubench.commands.overlap",
          "Copy/compute overlap: H2D -> kernel -> D2H on one stream vs chunks on N streams."),
    Entry("pin", "gpubench.bench.pin",
          "Cost of page-locking host memory and of cudaMalloc: cudaHostAlloc, cudaHostRegister, frees."),
    Entry("compare", "gpubench.commands.compare", "Compare saved results: per-figure change and a noise-aware verdict.",
          "no"),
    Entry("plot", "gpubench.commands.plot", "PNG of saved results: sweeps, strategy bars, busbw/algbw, p2p matrices, pairs.", "no"),
    Entry("report", "gpubench.commands.report", "One self-contained HTML page of results, comparisons, suites or a fleet.",
          "no"),
    Entry("suite", "gpubench.commands.suite", "Node validation: env, copy, batch, p2p, nccl; expectations from TOML.",
          "suite --check"),
)
REGISTRY: dict[str, Entry] = {e.name: e for e in ENTRIES}


def load_command(name: str):
    """The click command of ``name`` (imported now): its module's ``command``, or one generated
    from a plug-in module's declared OPTIONS, build_spec, format_report and HELP
    (``commands.common.benchmark_command``), made once per process.

    Raises:
        KeyError: ``name`` is not registered.
    """
    import importlib

    module = importlib.import_module(REGISTRY[name].module)
    cmd = getattr(module, "command", None)
    if cmd is None:
        from gpubench.commands.common import benchmark_command

        cmd = benchmark_command(name, module.OPTIONS, module.build_spec, module.format_report, help=module.HELP)
        setattr(module, "command", cmd)
    return cmd


def no_gpu_commands() -> tuple[str, ...]:
    """The commands (or their forms) that work without a GPU, in registry order."""
    return tuple(e.name if e.gpu == "no" else e.gpu for e in ENTRIES if e.gpu != "yes")


# This process's command line (saved in each result's "argv"); set by the CLI's entry point.
INVOCATION: list[str] = []
