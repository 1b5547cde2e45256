"""The plug-in descriptor: everything the layers above a command ask about it.

A command is one package (``gpubench.plugins.copy``, or a third party's) whose ``__init__`` holds a
:class:`Plugin`, found through the entry-point group ``gpubench.plugins`` (pytest's ``pytest11``
group and pluggy show the shape: the core declares what it asks, each plug-in answers, the core
never names one). The descriptor is plain data and ``"module:function"`` references, so reading it
(``gpubench --help`` lists every command) imports nothing heavy; a hook's module is imported only
when the hook is called (:meth:`Plugin.hook`). Each field's doc names the layer that asks it.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}\Z")
HOOK = re.compile(r"[A-Za-z_][\w.]{0,199}:[A-Za-z_]\w{0,99}\Z")  # "module:function"
PLOT_KINDS = ("sweep", "bars", "collective")


@dataclass(frozen=True)
class SuiteStep:
    """One step of ``gpubench suite`` (and of each node of the fleet suite), declared by a plug-in.

    Attributes:
        name: the step's row in the suite table ("nccl all-reduce").
        spec: the plug-in's Spec (:func:`gpubench.kit.default_spec` builds one with its command
            line's defaults and checks), never an argv; or a function of nothing that builds it
            when the step runs (a Spec that cannot be built where the step is skipped).
        order: where it runs among every plug-in's steps (copy 10, batch 20, p2p 30, nccl 40,
            net 45, merge 50; a third party's default 100).
        min_gpus: GPUs the step needs; fewer visible and it is skipped with that reason.
        opt_in: the suite option that asks for it ("--merge"), or None when it always runs.
        each_rank: on a fleet, every rank runs it on its own GPU (copy); otherwise only each
            node's local rank 0 does (steps over every GPU of the node).
        own_process: run it through the plug-in's single-process path even under a launcher
            (the fleet's per-node NCCL step).
        run: (spec, progress) -> Result, where the step is not its command's usual run (net's
            loopback test); None: the command's own.
    """

    name: str
    spec: Any
    order: int = 100
    min_gpus: int = 1
    opt_in: str | None = None
    each_rank: bool = False
    own_process: bool = False
    run: Callable | None = None


@dataclass(frozen=True)
class StepPlace:
    """What a plug-in's ``suite_steps`` hook is told about the node it runs on.

    Attributes:
        devices: the CUDA ordinals visible (0..n-1; empty on a node without a GPU).
        fleet: True on a node of the fleet suite (under a launcher).
        gpu: on a fleet, this rank's own GPU (its local rank modulo the GPUs); else None.
    """

    devices: tuple[int, ...]
    fleet: bool = False
    gpu: int | None = None


@dataclass
class StageContext:
    """What a fleet stage is told when it runs (every rank calls it, in the same order).

    Attributes:
        group: the fleet's rank group (:class:`gpubench.launch.ranks.Group`).
        leaders: the ranks that are local rank 0 of their host, ascending.
        n_gpus: GPUs visible to this rank.
        timeout: seconds a rank waits for another (``--node-timeout``).
        say: prints a progress line on rank 0 (unless ``-q``).
        stopped: why the fleet stopped before this stage (an earlier stage failed, a rank did not
            answer), or None.
    """

    group: Any
    leaders: list[int]
    n_gpus: int
    timeout: float
    say: Callable[[str], None]
    stopped: str | None = None


@dataclass
class StageOutcome:
    """What a fleet stage did: its row in the bundle's steps and what it adds to the fleet.

    Attributes:
        status: "ok", "error" or "skipped".
        reason: why it failed or was skipped.
        result: its Result on rank 0 (the all-node figures, the link matrix), or None.
        seconds: how long it took.
        checks: rows added to rank 0's checks (the whole fleet's figure).
        fault: the error that stops the later stages and fails every rank (a lost rank).
    """

    status: str
    reason: str = ""
    result: Any = None
    seconds: float | None = None
    checks: list = field(default_factory=list)
    fault: Exception | None = None


class FleetStage:
    """A step the fleet suite runs across nodes once every node's own steps are gathered (nccl's
    all-node all-reduce, net's links between nodes); a plug-in's ``fleet_stage`` hook returns one.

    Class attributes:
        name: the step's row ("net between nodes").
        order: where it runs among the stages (nccl 10, net 20).
        judges: words naming the step ("the network step") when the command's expectations are
            judged on this stage's result instead of the nodes' own results; None otherwise.
    """

    name: str = ""
    order: int = 100
    judges: str | None = None

    def run(self, ctx: StageContext) -> StageOutcome | None:
        """Run the stage on every rank; None when it does not apply here (nothing is recorded)."""
        raise NotImplementedError

    def rows(self, result, outcomes) -> tuple[dict | None, list[dict]]:
        """The fleet's ``links`` object (or None) and the fleet rows of ``result`` (its flags, and
        ``outcomes``, the expectations judged on it, deciding "fail")."""
        return None, []

    def report(self, result) -> list:
        """Renderables shown after the fleet table."""
        return []


@dataclass(frozen=True)
class Plugin:
    """What one command answers.

    Attributes:
        name: the command (``gpubench NAME``), also the ``command`` of its Results; lower case,
            digits, "-" and "_", at most 40 characters.
        help: one line for ``gpubench --help``.
        command: the module that defines its click ``command`` (a measuring command makes it with
            :func:`gpubench.kit.benchmark_command` from its options, spec builder and report).
        gpu: "yes" (needs a visible GPU), "no", or the form that works without one ("merge -t cpu").
        writes_results: its runs write Results of its name (False: compare, plot, report, suite,
            which work on saved ones).
        docs: the user's guide page of the command, relative to the project ("docs/copy.md").
        bench: the module whose ``run(spec, progress)`` runs a Spec through the driver (suite steps
            and the fleet call it); None for a command with no Spec.
        more_samples: words after "take" that give its figures more samples (compare's hint).
        added_options: Spec options added after results were saved, with the value that behaves
            as the results before them did (compare does not call their absence a difference).
        added_params: record params added later, with the value an older result measured: a
            record without the param pairs with one holding that value.
        incidental_options: Spec options that do not change what a figure means (net's port):
            compare does not list a difference in them.
        compare_notes: ``"module:function"``, (base, new) -> lines compare adds to its notes.
        plot_kind: how plot and report draw its records with a size axis: "sweep" (lines vs size), "bars"
            (one bar per strategy when there is one size) or "collective" (busbw, algbw and time).
        x_name: plot's x axis of its sweeps, where the size param's own name does not say it.
        matrix_ends: what the rows and columns of its src/dst matrices are ("GPU": p2p's; "rank":
            net's node x node test, one rank per node).
        suite_steps: ``"module:function"``, (StepPlace) -> [SuiteStep]: its steps of the suite.
        fleet_checks: ``"module:function"``, (Result) -> [check dicts]: the figures the fleet
            compares across nodes (:func:`gpubench.validation.fleet.checks_of`).
        fleet_stage: ``"module:function"``, () -> :class:`FleetStage`: a step the fleet runs
            across nodes after each node's own.
        metrics: ``"module:function"``, (Result) -> [(name, help, labels, value)]: gauges
            ``gpubench metrics`` exports besides each figure, named ``gpubench_<command>_<name>``
            (net's verdict on a slow node); labels a dict of str, value a number.
        host_memory: it allocates host buffers in this process, so ``--numa NODE|all`` applies.
        digit_groups: its integer options take "_" between digit groups on the command line
            (``-c 50_000_000``, as the tool it reproduces reads them).
        params_schema: its records' ``params`` as a JSON Schema fragment, ``{"properties":
            {name: schema}, "required": [names]}`` (:func:`params_schema` builds one); the
            published result schema holds it for results of this command, where no other param
            is allowed (:func:`gpubench.core.result.json_schema`). Empty: any scalar params.
    """

    name: str
    help: str
    command: str
    gpu: str = "yes"
    writes_results: bool = True
    docs: str = ""
    bench: str | None = None
    more_samples: str = "more samples per figure"
    added_options: Mapping[str, Any] = field(default_factory=dict)
    added_params: Mapping[str, Any] = field(default_factory=dict)
    incidental_options: tuple[str, ...] = ()
    compare_notes: str | None = None
    plot_kind: str = "sweep"
    x_name: str | None = None
    matrix_ends: str = "GPU"
    suite_steps: str | None = None
    fleet_checks: str | None = None
    fleet_stage: str | None = None
    metrics: str | None = None
    host_memory: bool = False
    digit_groups: bool = False
    params_schema: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check every field's type and form, so a broken descriptor is refused where it is made
        (the registry then leaves that plug-in out with one warning) and never breaks a command.

        Raises:
            ValueError: naming the field and what it takes.
        """
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ValueError(f"plug-in name {self.name!r:.60}: use lower case letters, digits, '-' and '_' "
                             "(at most 40, a letter first)")

        def bad(what: str, want: str) -> ValueError:
            return ValueError(f"plug-in {self.name}: {what} {getattr(self, what)!r:.60} is not {want}")

        for attr, limit in (("help", 200), ("command", 200), ("gpu", 80), ("docs", 200), ("more_samples", 200),
                            ("matrix_ends", 40)):
            v = getattr(self, attr)
            if not isinstance(v, str) or len(v) > limit or (attr in ("help", "command", "gpu", "matrix_ends")
                                                             and not v.strip()):
                raise bad(attr, f"a string of at most {limit} characters")
        for attr in ("bench", "x_name"):
            v = getattr(self, attr)
            if v is not None and (not isinstance(v, str) or len(v) > 200):
                raise bad(attr, "a string of at most 200 characters, or None")
        for attr in ("compare_notes", "suite_steps", "fleet_checks", "fleet_stage", "metrics"):
            v = getattr(self, attr)
            if v is not None and not (isinstance(v, str) and HOOK.match(v)):
                raise bad(attr, "a 'module:function' reference, or None")
        for attr in ("added_options", "added_params"):
            v = getattr(self, attr)
            if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
                raise bad(attr, "a mapping of option or param names")
        if not isinstance(self.incidental_options, tuple) or not all(isinstance(k, str) for k in self.incidental_options):
            raise bad("incidental_options", "a tuple of option names")
        for attr in ("writes_results", "host_memory", "digit_groups"):
            if not isinstance(getattr(self, attr), bool):
                raise bad(attr, "true or false")
        if self.plot_kind not in PLOT_KINDS:
            raise bad("plot_kind", f"one of {', '.join(PLOT_KINDS)}")
        ps = self.params_schema
        props = ps.get("properties") if isinstance(ps, Mapping) else None
        if ps and not (set(ps) <= {"properties", "required"} and isinstance(props, Mapping)
                       and all(isinstance(k, str) and isinstance(v, Mapping) for k, v in props.items())
                       and isinstance(ps.get("required", []), (list, tuple))
                       and all(k in props for k in ps.get("required", []))):
            raise bad("params_schema", "{'properties': {param: schema}, 'required': [params among them]}")

    def hook(self, attr: str) -> Callable | None:
        """The function a ``"module:function"`` field names, imported now; None where unset.

        Raises:
            ImportError, AttributeError: the reference does not resolve (a broken plug-in).
        """
        ref = getattr(self, attr)
        if ref is None:
            return None
        module, _, func = ref.partition(":")
        return getattr(importlib.import_module(module), func)


def param(json_type: str | list[str], description: str, **more: Any) -> dict[str, Any]:
    """One param's JSON Schema: ``{"type": json_type, "description": ..., **more}`` (``more``:
    further keywords, e.g. ``minimum=0``)."""
    return {"type": json_type, "description": description, **more}


def params_schema(required: Mapping[str, Mapping[str, Any]],
                  optional: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """A :attr:`Plugin.params_schema`: the params every record has (``required``) and those some
    records have (``optional``: a part of a bidirectional test, a param added after results were
    saved), each name -> its schema (:func:`param`)."""
    return {"properties": {**required, **(optional or {})}, "required": list(required)}
