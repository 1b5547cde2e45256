"""``gpubench env``: the environment report."""

from __future__ import annotations

import click
from rich.text import Text

from gpubench.kit import common_options, finish
from gpubench.core import env as envmod
from gpubench.core import report, safe
from gpubench.core.limits import pcie_label
from gpubench.core.result import Result
from gpubench.core.units import format_rate, format_size


@click.command("env")
@common_options
def command(json_path, units, quiet, debug):
    """The machine: GPUs, driver, CUDA, PCIe generation and width, NVLink, topology, NUMA.

    Works without a GPU: then it says so and prints the host part.
    """
    env = envmod.capture()
    result = Result(command="env", spec={}, timing={}, env=env)
    return finish(result, format_report(env, units), json_path=json_path, quiet=quiet)


def _fmt_bytes(n):
    return format_size(n) if isinstance(n, int) else "-"


def _t(text: object):
    """A cell or line from the machine or a saved file (hostname, CPU model from /proc/cpuinfo, GPU
    names, driver strings, errors): :func:`gpubench.core.safe.term` as rich ``Text``, never markup."""
    return Text(safe.term(text))


def format_report(env: dict, units: str = "GB") -> list:
    """Host table, GPU table, topology matrix (rich renderables). Every string from the
    environment is shown inert (:func:`_t`): a hostname or GPU name holding ANSI, OSC 8, CR/LF or
    rich markup is printed as its escapes."""
    out: list = []
    h = env.get("host") or {}
    v = env.get("versions") or {}
    c = env.get("cuda") or {}
    nvml = env.get("nvml") or {}
    out.append(report.kv_table("Host", [
        ("hostname", _t(h.get("hostname"))),
        ("os", _t(h.get("os"))),
        ("cpu", _t(f"{h.get('cpu_model')} ({h.get('cpu_count')} logical, {h.get('cpus_usable')} usable)")),
        ("numa nodes", _t(h.get("numa_nodes"))),
        ("memory", _t(f"{_fmt_bytes(h.get('mem_total_bytes'))} total, "
                      f"{_fmt_bytes(h.get('mem_available_bytes'))} available")),
        ("python", _t(h.get("python"))),
        ("versions", _t(", ".join(f"{k} {val}" for k, val in v.items() if k not in envmod.CUDA_WHEELS))),
        ("CUDA wheels", _t(", ".join(f"{k} {v.get(k) or '-'}" for k in envmod.CUDA_WHEELS))),
        ("CUDA driver / runtime", _t(f"{c.get('driver_version') or '-'} / {c.get('runtime_version') or '-'}")),
        ("NVRTC", _t(c.get("nvrtc_version") or "-")),
        ("NVIDIA driver", _t(nvml.get("driver_version") or "-")),
    ]))
    out.append(_support_table(h.get("python")))
    check = c.get("driver_check") or {}
    if check.get("warning"):
        out.append(_t(f"gpubench: warning: {check['warning']}"))
    gpus = env.get("gpus", [])
    if not gpus:
        why = c.get("error") or nvml.get("error") or "the CUDA runtime reports 0 devices"
        from gpubench.core.registry import no_gpu_commands

        out.append(_t(f"No CUDA device is visible ({why}). Commands that work without a GPU: "
                      f"{', '.join(no_gpu_commands())}."))
        return out
    t = report.table("GPUs", ["#", "name", "memory (free)", "PCIe now", "PCIe max", f"PCIe peak {units}/s",
                              "NVLink", "NUMA", "CPUs", "bus id"])
    for g in gpus:
        peak, per = g.get("pcie_peak_bytes_per_s"), g.get("nvlink_bytes_per_s_per_link")
        nvl = f"{g['nvlink_links_up']} x {format_rate(per, units) if per else '?'} {units}/s" \
            if g.get("nvlink_links_up") else "-"
        t.add_row(
            _t(g["index"]), _t(g.get("name")),
            f"{_fmt_bytes(g.get('memory_total_bytes'))} ({_fmt_bytes(g.get('memory_free_bytes'))})",
            _t(pcie_label(g.get("pcie_gen"), g.get("pcie_width"))),
            _t(pcie_label(g.get("pcie_gen_max"), g.get("pcie_width_max"))),
            format_rate(peak, units) if peak else "-", _t(nvl), _t(g.get("numa_node")),
            _t(g.get("cpu_affinity") or "-"), _t(g.get("pci_bus_id")),
        )
    out.append(t)
    if len(gpus) > 1:
        idx = [g["index"] for g in gpus]
        t = report.table("Topology", [""] + [f"GPU{safe.term_markup(i)}" for i in idx],
                         caption="NV# = # NVLinks; PIX/PXB/PHB/NODE/SYS = PCIe path (nvidia-smi topo -m legend)")
        for a in idx:
            t.add_row(_t(f"GPU{a}"), *["X" if a == b else _t(env["topology"].get(f"{min(a, b)},{max(a, b)}", "?"))
                                       for b in idx])
        out.append(t)
    return out


def _support_table(python: str | None):
    """What gpubench supports: Python, and per CUDA major the minimum driver and the GPUs."""
    from gpubench.support import CUDA_MAJORS, PYTHON_VERSIONS

    rows = [("python", f"{', '.join(PYTHON_VERSIONS)}" + (f" (this is {python})" if python else ""))]
    for major, info in sorted(CUDA_MAJORS.items()):
        rows.append((f"CUDA {major}.x", f"driver >= {info['min_driver']} (Linux); {info['architectures']}, compute "
                                        f"capability {info['compute_capability']}; gpubench-cuda[{info['extra']}]"))
    return report.kv_table("Supported", [(k, safe.term_markup(v, 2000)) for k, v in rows])  # python: from a file
