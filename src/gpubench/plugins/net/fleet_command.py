"""``gpubench net nodes`` (and plain ``gpubench net [OPTIONS]`` under a launcher): the TCP test
between the launcher's ranks, one rank per node (:mod:`gpubench.plugins.net.fleet`). This module
imports only click (``--help`` stays light).
"""

from __future__ import annotations

import signal

import click

from gpubench.kit import StrictFloat, StrictInt, Text, common_options


class LauncherGroup(click.Group):
    """``gpubench net``: under a launcher of 2 or more ranks, ``gpubench net [OPTIONS]`` is ``net nodes``."""

    def parse_args(self, ctx, args):
        if (not args or args[0].startswith("-")) and not any(a in ("-h", "--help") for a in args[:1]) \
                and _launched_ranks() > 1:
            args = ["nodes", *args]
        elif args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
            _not_launched(self, args)  # click would say only "No such option '-P'"
        return super().parse_args(ctx, args)


def _timeout_bound():
    """-T/--timeout's Bound, declared on :class:`gpubench.plugins.net.fleet.NetFleetSpec`."""
    from gpubench.core.bounds import field_bound
    from gpubench.plugins.net.fleet import NetFleetSpec

    return field_bound(NetFleetSpec, "timeout")


def _to_bound():
    """--to's Bound: a rank, 0 to MAX_RANKS - 1 (the launcher's size is checked once known)."""
    from gpubench.core.bounds import Bound
    from gpubench.launch.ranks import MAX_RANKS

    return Bound("--to", lo=0, hi=MAX_RANKS - 1)


def _check_values(build_request, params: dict, req=None) -> None:
    """net nodes' checks that need no launcher: the test options (unless ``req`` was built), -T, and
    the sign of --to. Raises UsageError naming the first bad value."""
    from gpubench.core.errors import UsageError

    if req is None:
        build_request(*(params[k] for k in ("streams", "seconds", "omit", "interval", "length")))
    _timeout_bound().check(params["timeout"])
    to = params["to"]
    if to is not None and to < 0:
        raise UsageError(f"--to {to} out of range", "use a rank, 0 to the number of ranks - 1")


def _not_launched(group: click.Group, args: list[str]) -> None:
    """``gpubench net -P 4`` outside a launcher. Raises UsageError, when the option is one of ``net
    nodes``', saying this form runs between a launcher's ranks and what to run here instead."""
    import shlex

    from gpubench.core.errors import UsageError
    from gpubench.core.safe import term

    def knows(cmd: click.Command | None, name: str) -> bool:
        return cmd is not None and any(name in p.opts or name in p.secondary_opts for p in cmd.params)

    names = [a.split("=", 1)[0] if a.startswith("--") else a[:2] for a in args if a.startswith("-")]  # -P4: -P
    nodes = group.commands.get("nodes")
    if nodes is None or not knows(nodes, names[0]):
        return
    with nodes.make_context("gpubench net", list(args)) as ctx:  # a bad value is named first, as net nodes names it
        _check_values(getattr(nodes, "build_request"), ctx.params)
    shown = term(shlex.join(args), 200)
    here = (f"here: gpubench net local {shown} (loopback), or gpubench net client HOST {shown} against a net "
            "server; " if all(knows(group.commands.get("local"), n) for n in names) else "")
    raise UsageError(f"gpubench net {shown}: with no sub-command, net runs between the ranks of a launcher "
                     "(mpirun, srun, torchrun), and none started this process",
                     f"{here}between nodes: mpirun -n 4 --map-by node gpubench net {shown}")


def _launched_ranks() -> int:
    import os

    from gpubench.launch import ranks

    try:
        me = ranks.discover(os.environ)
    except Exception:  # a malformed launcher environment: the sub-command reports it
        return 0
    return me.size if me.under_launcher else 0


HELP = """Under a launcher (mpirun, srun, torchrun): TCP throughput between the ranks, or UCX
    with --protocol ucx (host or GPU memory, -m).

    Start one rank per node. Every rank runs a net server; tests run in rounds in which no node
    is in two tests: ring neighbours (default), two rings that tell a slow node from a slow link
    (--pairs rings), every ordered pair (--pairs all, the circle method), or all ranks to one
    (--to RANK). Rank 0 prints the sender x receiver Gbit/s matrix; a link below the fleet rule's
    bound against the matrix median is flagged (exit 1), and the slow sender, receiver or link named.
    """


def nodes_command(test_options, build_request, ucx_options=(), build_ucx=None) -> click.Command:
    """The ``nodes`` sub-command, its options checked by ``build_request`` and ``build_ucx`` (UcxSpec or None)."""

    def callback(streams, seconds, omit, interval, length, pairs, to, bind, rendezvous, timeout, json_path, units,
                 quiet, debug, reverse=False, bidir=False, window=None, bitrate=None, copy=False, ipv4=False,
                 ipv6=False, protocol="tcp", **ucx):
        from gpubench.plugins.net import fleet as net_fleet
        from gpubench.kit import finish
        from gpubench.launch import ranks
        from gpubench.core.errors import MachineError, RegressionFound, UsageError, from_the_command_line
        from gpubench.core.signals import Interrupted

        with from_the_command_line():  # the options alone: every rank refuses them alike, and rank 0 alone says so
            if rendezvous is not None:
                ranks.parse_rendezvous(rendezvous)
            if ipv4 or ipv6:
                raise UsageError("-4/-6 are for net client and net local", "under a launcher, choose the family with -B/--bind")
            ctx = click.get_current_context()
            if to is not None and ctx.get_parameter_source("pairs") not in (None, click.core.ParameterSource.DEFAULT):
                # --to is one round of many-to-one; --pairs was silently ignored beside it
                raise UsageError(f"--to {to} and --pairs {pairs} are two schedules", "give one of them")
            test = dict(streams=streams, seconds=seconds, omit=omit, interval=interval, length=length, reverse=reverse,
                        bidir=bidir, window=window, bitrate=bitrate, copy=copy)
            ucx_spec = build_ucx(protocol, test, **ucx) if build_ucx else None
            req = ucx_spec.request if ucx_spec is not None else build_request(**test)
            _check_values(build_request, {"timeout": timeout, "to": to}, req)  # before the launcher's checks
            me = ranks.discover()
            if not me.under_launcher:
                raise UsageError("gpubench net nodes runs under a launcher (mpirun, srun, torchrun) or with RANK, "
                                 "WORLD_SIZE, MASTER_ADDR and MASTER_PORT set",
                                 "e.g. mpirun -n 4 gpubench net nodes; between two hosts: net server / net client")
            if me.size == 1:  # nothing between nodes to measure: an empty matrix and exit 0 would pass a check
                raise UsageError(f"gpubench net nodes needs 2 or more ranks; the launcher ({me.launcher}) started 1",
                                 "start one rank per node (mpirun -n 4 --map-by node, srun -N 4 --ntasks-per-node=1); "
                                 "on one host: gpubench net local")
            if to is not None and me.size and not 0 <= to < me.size:
                raise UsageError(f"--to {to} out of range", f"use a rank 0 to {me.size - 1}")
            spec = net_fleet.NetFleetSpec(req, pairs, to, bind, connect_timeout=min(timeout, 10.0), timeout=timeout,
                                          ucx=ucx_spec)
        net_fleet.check_machine(spec)  # this rank's own machine: said by the rank that lacks it
        group = ranks.join(me, rendezvous, timeout=timeout)
        try:
            result = net_fleet.run(group, spec, keep_partial=True)
            if result is None:
                code = 0
            else:  # rank 0 reports before the close, whose end the others wait for
                code = finish(result, net_fleet.format_report(result, units), json_path=json_path, quiet=quiet)
                if result.partial:  # interrupted: kept the rounds that ended; told to the others
                    group.close(quiet=True, interrupted=Interrupted(signal.Signals[result.interrupted_by].value))
                    return code
                why = net_fleet.verdict(result)
                if why:
                    raise RegressionFound(why)
        except MachineError as e:  # a rank lost: rank 0 shows and saves the rounds that ended first
            if e.partial_result is not None:
                finish(e.partial_result, net_fleet.format_report(e.partial_result, units), json_path=json_path,
                       quiet=quiet)
            group.close(quiet=True)
            raise
        except BaseException:
            group.close(quiet=True)  # the end is still said (rank 0 confirms it), but the error on its way wins
            raise
        group.close(quiet=False)  # exit 0 only once rank 0 confirmed the end (raises naming the rank that did not)
        return code

    callback.__doc__ = HELP
    f = common_options(callback, written_by_rank_0=True)
    opts = [*test_options, *ucx_options,
            click.option("--pairs", type=click.Choice(["ring", "rings", "all"]), default="ring", show_default=True,
                         help="ring: rank i to i+1 (2 rounds, 3 for an odd count); rings: that ring and a second of "
                              "stride s, so a slow node is told from a slow link (4 rounds, 5 for an odd count); "
                              "all: every ordered pair (2(n-1) rounds)."),
            click.option("--to", "to", type=StrictInt(bound=_to_bound), default=None, help="Many-to-one: every other rank sends to RANK at once."),
            click.option("-B", "--bind", type=Text(), default="0.0.0.0", show_default=True,
                         help="Address each rank's server listens on (a specific one is also told to the peers)."),
            click.option("--rendezvous", default=None, help="HOST:PORT of rank 0's store (default: the launcher's)."),
            click.option("-T", "--timeout", type=StrictFloat(bound=_timeout_bound), default=60.0, show_default=True,
                         help="Seconds to wait for the other ranks: to join, and from a round's start to its end "
                              "(at least the round's length: -O + -t + -i + 10 s + 5 s, 10 s more over UCX); a rank "
                              "later than that is named."),
            ]
    for opt in reversed(opts):
        f = opt(f)
    cmd = click.command("nodes", help=HELP)(f)
    cmd.build_request = build_request  # type: ignore[attr-defined]  # _not_launched checks the values with it
    return cmd
