"""``gpubench pin``'s click command, generated from the options, spec builder and report that
:mod:`gpubench.plugins.pin.bench` declares beside its benchmark."""

from gpubench.kit import benchmark_command
from gpubench.plugins.pin.bench import HELP, OPTIONS, build_spec, format_report

command = benchmark_command("pin", OPTIONS, build_spec, format_report, help=HELP)
