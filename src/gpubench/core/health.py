"""GPU health counters from NVML (nvidia-ml-py), read before and after a command's points (the
counters DCGM's diagnostic judges a node on), with XID events watched in between; saved as
``env["health"]`` (each counter's NVML source: docs/env.md)::

    {"gpus": [{"index": 0, "uuid": "GPU-...", "before": COUNTERS, "after": COUNTERS}],
     "xid_events": [{"index": 0, "xid": 79}] | "unsupported" | null, "error": null | "why nothing was read"}

    COUNTERS = {"pcie_replays", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlinks_up": int,
                "nvlink_errors": {"LINK": {"replay", "recovery", "crc_flit", "crc_data"}},
                "ecc": {"volatile", "aggregate": {"corrected", "uncorrected"}},
                "remapped_rows": {"corrected", "uncorrected", "pending", "failed"},
                "retired_pages": {"single_bit", "double_bit", "pending"}}  # before Ampere

Every value is the counter, ``"unsupported"`` where the driver answers NVML_ERROR_NOT_SUPPORTED, or
null where the query failed otherwise. ``xid_events``: nvmlEventTypeXidCriticalError events;
"unsupported" where events cannot be registered, null when NVML is absent.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

from gpubench.core.env import nvml_handles

UNSUPPORTED = "unsupported"
# nvmlNvLinkErrorCounter_t, nvml.h: NVML_NVLINK_ERROR_DL_REPLAY 0, _RECOVERY 1, _CRC_FLIT 2, _CRC_DATA 3
NVLINK_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")
MAX_XID_EVENTS = 1000  # kept per run; a GPU in an XID storm must not fill the result


def _query(nv, fn_name: str, *args) -> Any:
    """``nv.fn_name(*args)``; "unsupported" on NVML_ERROR_NOT_SUPPORTED (or a function this
    nvidia-ml-py lacks), None on any other error."""
    fn = getattr(nv, fn_name, None)
    if fn is None:
        return UNSUPPORTED
    try:
        return fn(*args)
    except Exception as e:
        not_supported = getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3)
        return UNSUPPORTED if getattr(e, "value", None) == not_supported else None


def _int(v: Any) -> Any:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else v


def _nvlinks(nv, h) -> tuple[Any, Any]:
    """(links up, {link: {counter: value}}) or "unsupported"/None for both."""
    up = []
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        state = _query(nv, "nvmlDeviceGetNvLinkState", h, link)
        if link == 0 and not isinstance(state, int):
            return state, state  # no NVLink on this GPU, or no answer
        if state == 1:
            up.append(link)
    errors = {str(link): {name: _int(_query(nv, "nvmlDeviceGetNvLinkErrorCounter", h, link, c))
                          for c, name in enumerate(NVLINK_COUNTERS)} for link in up}
    return len(up), errors


def _ecc(nv, h) -> Any:
    out: dict[str, dict[str, Any]] = {}
    for where, counter in (("volatile", "NVML_VOLATILE_ECC"), ("aggregate", "NVML_AGGREGATE_ECC")):
        out[where] = {}
        for kind, etype in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            v = _query(nv, "nvmlDeviceGetTotalEccErrors", h, getattr(nv, etype, 0 if kind == "corrected" else 1),
                       getattr(nv, counter, 0 if where == "volatile" else 1))
            if v == UNSUPPORTED:
                return UNSUPPORTED  # ECC off or absent: no counter at all
            out[where][kind] = _int(v)
    return out


def _remapped(nv, h) -> Any:
    got = _query(nv, "nvmlDeviceGetRemappedRows", h)
    if not isinstance(got, (tuple, list)) or len(got) != 4:
        return got
    corr, unc, pending, failed = got
    return {"corrected": _int(corr), "uncorrected": _int(unc), "pending": bool(pending), "failed": bool(failed)}


def _retired(nv, h) -> Any:
    out: dict[str, Any] = {}
    for name, cause in (("single_bit", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
                        ("double_bit", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")):
        pages = _query(nv, "nvmlDeviceGetRetiredPages", h, getattr(nv, cause, 0 if name == "single_bit" else 1))
        if pages == UNSUPPORTED:
            return UNSUPPORTED
        out[name] = len(pages) if isinstance(pages, (list, tuple)) else None
    pending = _query(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h)
    out["pending"] = bool(pending) if isinstance(pending, int) else pending
    return out


def read(nv, h) -> dict[str, Any]:
    """The COUNTERS of one GPU (module docstring) through the NVML module ``nv`` and the device
    handle ``h``. Never raises."""
    up, errors = _nvlinks(nv, h)
    remapped = _remapped(nv, h)
    pcie = {k: _int(_query(nv, fn, h)) for k, fn in (
        ("pcie_replays", "nvmlDeviceGetPcieReplayCounter"), ("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration"),
        ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"), ("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth"),
        ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth"))}
    return {**pcie, "nvlinks_up": up, "nvlink_errors": errors, "ecc": _ecc(nv, h), "remapped_rows": remapped,
            # pages are retired only where rows are not remapped (before Ampere)
            "retired_pages": _retired(nv, h) if remapped == UNSUPPORTED else UNSUPPORTED}


class Watch:
    """The health of the run's GPUs (the env's ``gpus`` entries): :meth:`start` reads them and
    registers for XID events, :meth:`stop` reads them again and collects the events; :attr:`block`
    is ``env["health"]``. ``nv``: the NVML module (default: pynvml, owned here)."""

    def __init__(self, gpus: Sequence[dict], nv=None):
        self.block: dict[str, Any] = {"gpus": [], "xid_events": None, "error": None}
        self._owned = nv is None
        self._nv = nv
        self._handles: list[tuple[dict, Any]] = []
        self._events = None
        self._gpus = list(gpus)

    def start(self) -> None:
        if self._nv is None:
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception as e:
                self.block["error"] = f"NVML not available ({type(e).__name__})"
                return
            self._nv = pynvml
        nv = self._nv
        self._handles = nvml_handles(nv, self._gpus)
        for g, h in self._handles:
            self.block["gpus"].append({"index": g.get("index"), "uuid": g.get("uuid"), "before": read(nv, h),
                                       "after": None})
        if not self._handles:
            self.block["error"] = "NVML knows none of the GPUs used"
            return
        events = _query(nv, "nvmlEventSetCreate")
        if not _handle(events):
            self.block["xid_events"] = UNSUPPORTED if events == UNSUPPORTED else None
            return
        xid = getattr(nv, "nvmlEventTypeXidCriticalError", 8)
        for _g, h in self._handles:
            try:
                nv.nvmlDeviceRegisterEvents(h, xid, events)
            except Exception:  # NOT_SUPPORTED, or NO_PERMISSION in a container: no events this run
                self.block["xid_events"] = UNSUPPORTED
                _query(nv, "nvmlEventSetFree", events)
                return
        self._events = events
        self.block["xid_events"] = []

    def stop(self) -> dict[str, Any]:
        nv = self._nv
        if nv is None:
            return self.block
        for entry, (_g, h) in zip(self.block["gpus"], self._handles):
            entry["after"] = read(nv, h)
        if self._events is not None:
            index_of = {_uuid_of(nv, h): g.get("index") for g, h in self._handles}
            seen = self.block["xid_events"]
            while len(seen) < MAX_XID_EVENTS:
                try:
                    data = nv.nvmlEventSetWait_v2(self._events, 0)
                except Exception:
                    break  # NVML_ERROR_TIMEOUT: no more events
                seen.append({"index": index_of.get(_uuid_of(nv, getattr(data, "device", None))),
                             "xid": _int(getattr(data, "eventData", None))})
            _query(nv, "nvmlEventSetFree", self._events)
            self._events = None
        if self._owned:
            _query(nv, "nvmlShutdown")
        self._nv = None
        return self.block


def _handle(h: Any) -> bool:
    return h is not None and h != UNSUPPORTED


def _uuid_of(nv, h) -> Any:
    u = _query(nv, "nvmlDeviceGetUUID", h) if h is not None else None
    return u.decode() if isinstance(u, bytes) else u


@contextlib.contextmanager
def watch(gpus: Sequence[dict], enabled: bool, nv=None) -> Iterator[Watch | None]:
    """A started :class:`Watch` of ``gpus``, stopped after the block; None when not ``enabled``."""
    if not enabled:
        yield None
        return
    w = Watch(gpus, nv)
    w.start()
    try:
        yield w
    finally:
        w.stop()
