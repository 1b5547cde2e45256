"""GPU health counters (core/health.py) through NVML's seam: a stand-in module with pynvml's
constants and error class whose counters are constructed here, so every branch (counters read, a
query the GPU does not support, a query that fails, XID events, events not permitted) is checked
without a GPU; and the block through the result validator and the JSON Schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

pynvml = pytest.importorskip("pynvml")

from gpubench.core import health  # noqa: E402
from gpubench.core.errors import UsageError  # noqa: E402
from gpubench.core.result import Result, check_result, json_schema, load, save  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


def _err(code):
    return pynvml.NVMLError(code)


class Gpu:
    def __init__(self, uuid, *, replays=0, links=(), nvlink=True, ecc=True, remap=True, gen=5, width=16,
                 fail=()):
        self.uuid, self.replays, self.links, self.nvlink = uuid, replays, dict(links), nvlink
        self.ecc = {(0, 0): 3, (1, 0): 0, (0, 1): 40, (1, 1): 0} if ecc else None
        self.remap = (2, 0, False, False) if remap else None
        self.gen, self.width, self.fail = gen, width, set(fail)


class FakeNVML:
    """pynvml's functions the health module calls, answering from Gpu objects."""

    def __init__(self, gpus, events=(), register_error=None):
        for k in dir(pynvml):
            if k.startswith(("NVML_", "nvmlEventType")):
                setattr(self, k, getattr(pynvml, k))
        self.gpus = {g.uuid: g for g in gpus}
        self.events = list(events)
        self.register_error = register_error
        self.registered: list = []
        self.freed = False

    def _g(self, h, what):
        if what in h.fail:
            raise _err(pynvml.NVML_ERROR_UNKNOWN)
        return h

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.gpus:
            raise _err(pynvml.NVML_ERROR_NOT_FOUND)
        return self.gpus[uuid]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetPcieReplayCounter(self, h):
        return self._g(h, "replay").replays

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return h.gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return h.width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetNvLinkState(self, h, link):
        if not h.nvlink:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 18:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link in h.links else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, h, link, counter):
        return h.links[link][counter]

    def nvmlDeviceGetTotalEccErrors(self, h, etype, ctype):
        if h.ecc is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.ecc[(etype, ctype)]

    def nvmlDeviceGetRemappedRows(self, h):
        if h.remap is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h.remap

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return [0x1000] * (cause + 1)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return 0

    def nvmlEventSetCreate(self):
        return "set"

    def nvmlDeviceRegisterEvents(self, h, types, event_set):
        if self.register_error is not None:
            raise _err(self.register_error)
        self.registered.append((h.uuid, types))

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not self.events:
            raise _err(pynvml.NVML_ERROR_TIMEOUT)
        uuid, xid = self.events.pop(0)
        return type("Data", (), {"device": self.gpus[uuid], "eventData": xid})()

    def nvmlEventSetFree(self, event_set):
        self.freed = True


NVLINK = {0: (0, 0, 5, 1), 1: (2, 0, 0, 0)}  # replay, recovery, crc_flit, crc_data


def test_every_counter_is_read_as_the_driver_gives_it():
    nv = FakeNVML([Gpu("GPU-a", replays=7, links=NVLINK, gen=4, width=8)])
    got = health.read(nv, nv.gpus["GPU-a"])
    assert got == {
        "pcie_replays": 7, "pcie_gen": 4, "pcie_gen_max": 5, "pcie_width": 8, "pcie_width_max": 16,
        "nvlinks_up": 2,
        "nvlink_errors": {"0": {"replay": 0, "recovery": 0, "crc_flit": 5, "crc_data": 1},
                          "1": {"replay": 2, "recovery": 0, "crc_flit": 0, "crc_data": 0}},
        "ecc": {"volatile": {"corrected": 3, "uncorrected": 0}, "aggregate": {"corrected": 40, "uncorrected": 0}},
        "remapped_rows": {"corrected": 2, "uncorrected": 0, "pending": False, "failed": False},
        "retired_pages": "unsupported",  # rows are remapped: pages are not retired
    }


def test_a_counter_the_gpu_lacks_is_unsupported_and_a_failed_query_is_null_never_zero():
    nv = FakeNVML([Gpu("GPU-pcie", nvlink=False, ecc=False, remap=False, fail={"replay"})])
    got = health.read(nv, nv.gpus["GPU-pcie"])
    assert got["nvlinks_up"] == "unsupported" and got["nvlink_errors"] == "unsupported"
    assert got["ecc"] == "unsupported" and got["remapped_rows"] == "unsupported"
    assert got["retired_pages"] == {"single_bit": 1, "double_bit": 2, "pending": False}
    assert got["pcie_replays"] is None


def test_a_watch_reads_before_and_after_and_collects_the_xid_events_between():
    a, b = Gpu("GPU-a", replays=1, links=NVLINK), Gpu("GPU-b")
    nv = FakeNVML([a, b], events=[("GPU-b", 79), ("GPU-a", 48)])
    gpus = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}, {"index": 2, "uuid": "GPU-gone"}]
    with health.watch(gpus, True, nv) as w:
        assert w is not None and nv.registered == [("GPU-a", 8), ("GPU-b", 8)]
        a.replays = 9
    block = w.block
    assert [(g["index"], g["before"]["pcie_replays"], g["after"]["pcie_replays"]) for g in block["gpus"]] == [
        (0, 1, 9), (1, 0, 0)]
    assert block["xid_events"] == [{"index": 1, "xid": 79}, {"index": 0, "xid": 48}]
    assert nv.freed and block["error"] is None


def test_events_that_cannot_be_registered_are_unsupported_and_the_counters_still_read():
    nv = FakeNVML([Gpu("GPU-a")], register_error=pynvml.NVML_ERROR_NO_PERMISSION)
    with health.watch([{"index": 0, "uuid": "GPU-a"}], True, nv) as w:
        pass
    assert w.block["xid_events"] == "unsupported" and nv.freed
    assert w.block["gpus"][0]["after"]["pcie_replays"] == 0


def test_no_watch_when_off_and_an_unknown_gpu_is_said():
    with health.watch([{"index": 0}], False) as w:
        assert w is None
    with health.watch([{"index": 0, "uuid": "GPU-x"}], True, FakeNVML([])) as w:
        pass
    assert w.block == {"gpus": [], "xid_events": None, "error": "NVML knows none of the GPUs used"}


def _with_health(block) -> dict:
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    d["env"]["health"] = block
    return d


def _block() -> dict:
    nv = FakeNVML([Gpu("GPU-a", links=NVLINK), Gpu("GPU-p", nvlink=False, ecc=False, remap=False)],
                  events=[("GPU-a", 79)])
    with health.watch([{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-p"}], True, nv) as w:
        pass
    return w.block


def test_the_block_round_trips_through_a_saved_result_and_the_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    d = _with_health(_block())
    jsonschema.validate(d, json_schema())
    res = Result.from_dict(d)
    path = save(res, tmp_path / "r.json")
    assert load(path).env["health"] == d["env"]["health"]


@pytest.mark.parametrize("path, value", [
    (("gpus", 0, "before", "pcie_replays"), -1),
    (("gpus", 0, "before", "pcie_replays"), 1.5),
    (("gpus", 0, "before", "pcie_replays"), "many"),
    (("gpus", 0, "after", "ecc", "volatile", "corrected"), [1]),
    (("gpus", 0, "before", "nvlink_errors", "0", "crc_flit"), {"deeper": 1}),
    (("gpus", 0, "index"), "zero"),
    (("xid_events",), "some"),
    (("xid_events", 0, "xid"), -79),
])
def test_a_malformed_block_is_refused_naming_its_pointer(path, value):
    jsonschema = pytest.importorskip("jsonschema")
    d = _with_health(_block())
    node = d["env"]["health"]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(UsageError) as e:
        check_result(copy.deepcopy(d), "r.json")
    assert "/env/health/" + "/".join(map(str, path)) in str(e.value), str(e.value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(d, json_schema())


# ---- [health] expectations (validation/health.py) ----

HEALTHY = {"pcie_replays": 3, "pcie_gen": 5, "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16,
           "nvlinks_up": 18, "nvlink_errors": {"0": {"replay": 0, "recovery": 0, "crc_flit": 1, "crc_data": 0}},
           "ecc": {"volatile": {"corrected": 0, "uncorrected": 0}, "aggregate": {"corrected": 5, "uncorrected": 0}},
           "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": False, "failed": False},
           "retired_pages": "unsupported"}


def _health_result(gpus: list[tuple[dict, dict]], xids=()) -> dict:
    d = json.loads((DATA / "copy-pinned-h200.json").read_text())
    d["env"]["health"] = {"gpus": [{"index": i, "uuid": f"GPU-{i}", "before": b, "after": a}
                                   for i, (b, a) in enumerate(gpus)],
                          "xid_events": [{"index": i, "xid": x} for i, x in xids], "error": None}
    return d


HEALTH_TOML = """
[health]
max_pcie_replays = 0
pcie_gen = 5
pcie_width = 16
nvlinks_up = 18
max_nvlink_errors = 0
max_ecc_uncorrected = 0
no_remap_failure = true
max_xid_events = 0
"""


def _expect(text: str):
    import tomllib

    from gpubench.validation.suite import parse_expectations

    return parse_expectations(tomllib.loads(text), "e.toml", ["copy"])


def test_each_health_rule_fails_the_gpu_that_breaks_it_naming_the_counter_and_its_value():
    from gpubench.validation.suite import evaluate

    sick_before = copy.deepcopy(HEALTHY)
    sick_after = copy.deepcopy(HEALTHY)
    sick_before.update(pcie_gen=4, pcie_width=8)  # trained down on both reads
    sick_after.update(pcie_replays=12, pcie_gen=4, pcie_width=8, nvlinks_up=17)
    sick_after["nvlink_errors"]["0"]["crc_flit"] = 9
    sick_after["ecc"]["volatile"]["uncorrected"] = 2
    sick_after["remapped_rows"]["failed"] = True
    # GPU 1 idles at Gen1 before the run and reaches Gen5 x16 under load: it passes
    idle = dict(HEALTHY, pcie_gen=1, pcie_width=4)
    res = Result.from_dict(_health_result([(sick_before, sick_after), (idle, HEALTHY)], xids=[(0, 79)]))
    got = {(o.expectation.name, o.params["device"]): o for o in evaluate(_expect(HEALTH_TOML), [res])}
    assert {k for k, o in got.items() if o.status == "pass"} == {(n, 1) for n, _ in got}
    fails = {n: (o.value, o.note) for (n, gpu), o in got.items() if gpu == 0}
    assert fails == {
        "max_pcie_replays = 0": (9.0, "GPU 0 (GPU-0): PCIe replays during the runs 9, <= 0"),
        "pcie_gen = 5": (4.0, "GPU 0 (GPU-0): PCIe generation (highest read) 4, >= 5"),
        "pcie_width = 16": (8.0, "GPU 0 (GPU-0): PCIe width (highest read) 8, >= 16"),
        "nvlinks_up = 18": (17.0, "GPU 0 (GPU-0): NVLinks up (lowest read) 17, >= 18"),
        "max_nvlink_errors = 0": (8.0, "GPU 0 (GPU-0): NVLink errors during the runs 8, <= 0"),
        "max_ecc_uncorrected = 0": (2.0, "GPU 0 (GPU-0): uncorrected ECC errors (volatile) 2, <= 0"),
        "no_remap_failure = true": (1.0, "GPU 0 (GPU-0): reads with a failed row remap 1, <= 0"),
        "max_xid_events = 0": (1.0, "GPU 0 (GPU-0): XID events during the runs 1, <= 0"),
    }
    assert all(got[(n, 0)].status == "fail" for n, _ in got)


def test_a_counter_the_gpu_lacks_is_skipped_and_strict_fails_it():
    from gpubench.validation.suite import evaluate, failures

    pcie_card = dict(HEALTHY, nvlinks_up="unsupported", nvlink_errors="unsupported", ecc="unsupported")
    res = Result.from_dict(_health_result([(pcie_card, pcie_card)]))
    out = evaluate(_expect("[health]\nnvlinks_up = 18\nmax_ecc_uncorrected = 0\nmax_pcie_replays = 0\n"), [res])
    assert [(o.status, o.note) for o in out] == [
        ("skipped", "GPU 0 (GPU-0): NVLinks up (lowest read): not supported by this GPU"),
        ("skipped", "GPU 0 (GPU-0): uncorrected ECC errors (volatile): not supported by this GPU"),
        ("pass", "")]
    assert failures(out) == [] and len(failures(out, strict=True)) == 2
    old = Result.from_dict(json.loads((DATA / "copy-pinned-h200.json").read_text()))  # saved before env.health
    assert [(o.status, o.note) for o in evaluate(_expect("[health]\npcie_gen = 5\n"), [old])] == [
        ("skipped", "no result holds GPU health counters (env.health)")]


@pytest.mark.parametrize("body, words", [
    ("[health]\npcie_genn = 5", "unknown key 'pcie_genn' (known: max_pcie_replays, pcie_gen, pcie_width"),
    ("[health]\npcie_gen = '5'", "pcie_gen = '5' must be an integer 0..1,000,000,000,000"),
    ("[health]\nmax_pcie_replays = -1", "must be an integer 0..1,000,000,000,000"),
    ("[health]\nmax_pcie_replays = 1.5", "must be an integer"),
    ("[health]\nmax_xid_events = 100000000000000000000", "(a 21-digit integer) must be an integer"),
    ("[health]\nno_remap_failure = 1", "no_remap_failure = 1 must be true or false"),
    ("health = 5", "[health] must be a table of counter bounds"),
    ("[[expect]]\ncommand = 'copy'\nmax_count = 0", "must be an integer 0..1,000,000,000,000 of a health expectation"),
    ("[[expect]]\ncommand = 'health'\nfigure = 'health.pcie_gen'\nmin_gbps = 1",
     "a health expectation bounds a count"),
    ("[[expect]]\ncommand = 'health'\nfigure = 'median'\nmax_count = 0", "figure 'median' is no health counter"),
])
def test_a_bad_health_table_is_refused_naming_the_key(body, words):
    with pytest.raises(UsageError) as e:
        _expect(body)
    assert words in e.value.one_line(), e.value.one_line()


def test_health_outcomes_round_trip_through_a_bundle():
    from gpubench.validation.suite import Bundle, evaluate

    res = Result.from_dict(_health_result([(HEALTHY, dict(HEALTHY, pcie_replays=4))]))
    b = Bundle(outcomes=evaluate(_expect(HEALTH_TOML), [res]), expect_file="e.toml")
    again = Bundle.from_dict(json.loads(json.dumps(b.to_dict())), "b.json")
    assert [(o.expectation, o.status, o.value, o.note) for o in again.outcomes] == [
        (o.expectation, o.status, o.value, o.note) for o in b.outcomes]
    assert again.outcomes[0].to_dict()["unit"] == "" and again.outcomes[0].status == "fail"


def test_suite_check_fails_on_a_sick_gpu_and_names_it(run_cli, tmp_path):
    d = _health_result([(HEALTHY, dict(HEALTHY, pcie_replays=40))])
    src = tmp_path / "r.json"
    src.write_text(json.dumps(d))
    toml = tmp_path / "e.toml"
    toml.write_text("[health]\nmax_pcie_replays = 0\npcie_gen = 5\n")
    code, out, err = run_cli("suite", "--check", src, "--expect", toml)
    assert code == 1 and "1 expectation(s) not met" in err, err
    assert "PCIe replays during the runs 37, <= 0" in out and "FAILED: 1 pass, 1 fail" in out, out


def test_xid_events_seen_in_one_run_fail_even_where_another_run_could_not_watch():
    from gpubench.validation.suite import evaluate

    seen = _health_result([(HEALTHY, HEALTHY)], xids=[(0, 79)])
    blind = _health_result([(HEALTHY, HEALTHY)])
    blind["env"]["health"]["xid_events"] = "unsupported"
    rule = _expect("[health]\nmax_xid_events = 0\n")
    for order in ((seen, blind), (blind, seen)):
        (o,) = evaluate(rule, [Result.from_dict(d) for d in order])
        assert (o.status, o.value) == ("fail", 1.0)
    (o,) = evaluate(rule, [Result.from_dict(blind), Result.from_dict(_health_result([(HEALTHY, HEALTHY)]))])
    assert o.status == "skipped" and "not supported" in o.note  # 0 seen in one run, the other blind


def test_a_counter_read_lower_after_the_runs_fails_as_a_reset_not_as_zero():
    """NVML's replay and NVLink error counters only grow while the driver stays loaded: one lower
    after the runs than before means the GPU or driver was reset in between, which is not "0
    during the runs"."""
    from gpubench.validation.suite import evaluate

    before = dict(HEALTHY, pcie_replays=10)
    after = copy.deepcopy(dict(HEALTHY, pcie_replays=0))
    after["nvlink_errors"]["0"]["crc_flit"] = 0
    before = copy.deepcopy(before)
    before["nvlink_errors"]["0"]["crc_flit"] = 5
    res = Result.from_dict(_health_result([(before, after)]))
    out = evaluate(_expect("[health]\nmax_pcie_replays = 0\nmax_nvlink_errors = 0\n"), [res])
    assert [(o.status, o.note) for o in out] == [
        ("fail", "GPU 0 (GPU-0): PCIe replays during the runs went backwards between the reads before and after "
                 "the runs: the GPU or its driver was reset during them"),
        ("fail", "GPU 0 (GPU-0): NVLink errors during the runs went backwards between the reads before and after "
                 "the runs: the GPU or its driver was reset during them")]
