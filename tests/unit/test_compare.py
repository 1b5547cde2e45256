"""compare: the Mann-Whitney U test, the Hodges-Lehmann change and its interval, verdicts on constructed
samples and samples from known distributions, pairing, env diff, telemetry and flags, escaping."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench.analysis import compare as cmp  # noqa: E402
from gpubench.core.errors import UsageError  # noqa: E402
from gpubench.core.result import Record, Result, load  # noqa: E402


# ---- Mann-Whitney U ----

def test_mwu_separated_small_samples_by_hand():
    # x all below y: U1 = 0, mu = 4.5, sigma^2 = 9/12 * 7 = 5.25, z = (4.5 - 0.5)/sqrt(5.25)
    r = cmp.mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert r.u == 0
    z = 4.0 / math.sqrt(5.25)
    assert r.z == pytest.approx(-z)
    # no ties, 3 values: exact. Of the C(6, 3) = 20 orderings one gives U = 0: p = 2 / 20
    assert r.method == "exact" and r.p == pytest.approx(0.1) and r.p_min == pytest.approx(0.1)
    # with a tie, small samples use the exact permutation distribution given the tied ranks
    t = cmp.mann_whitney_u([1, 2, 3], [3, 5, 6])
    assert t.method == "exact (ties)"


def test_mwu_exact_with_ties_by_hand():
    # x = 1, 2 and y = 2, 3: ranks 1, 2.5, 2.5, 4. The 6 ways to give x two of them have U = 0.5, 0.5,
    # 2, 2, 3.5, 3.5 (mu = 2); the observed U = 0.5 is 1.5 from mu, as are 4 of the 6: p = 4/6
    r = cmp.mann_whitney_u([1, 2], [2, 3])
    assert r.method == "exact (ties)" and r.u == 0.5 and r.p == pytest.approx(4 / 6)


def test_a_tie_does_not_hide_a_doubled_latency():
    # 5 vs 5 with one tie inside the base: the normal approximation's best p is ~0.012 (> 0.01)
    base = [2.2e-6, 2.2e-6, 2.3e-6, 2.25e-6, 2.21e-6]
    slow = [2 * v for v in base]
    r = cmp.mann_whitney_u(slow, base)
    assert r.p == pytest.approx(2 / 252) and r.p < 0.01


def test_mwu_exact_null_distribution_by_hand():
    # n1 = n2 = 2: the 6 orderings give U = 0, 1, 2, 2, 3, 4
    assert cmp._u_counts(2, 2).tolist() == [1, 1, 2, 1, 1]
    # 5 against 5, completely separated: 2 / C(10, 5) = 2 / 252, the only way under 0.01 with 5 samples
    r = cmp.mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert r.p == pytest.approx(2 / 252) and r.p < 0.01
    assert cmp.min_p(3, 3) == pytest.approx(0.1) and cmp.min_p(5, 5) == pytest.approx(2 / 252)


def test_mwu_tie_correction_by_hand():
    # values 1,2,2,3 | 2,3,3,4: two tie groups of three (the 2s and the 3s), each adding t^3 - t = 24
    x, y = [1, 2, 2, 3], [2, 3, 3, 4]
    # ranks: 1 -> 1; 2,2,2 -> 3; 3,3,3 -> 6; 4 -> 8. R1 = 1 + 3 + 3 + 6 = 13, U1 = 13 - 10 = 3
    r = cmp.mann_whitney_u(x, y)
    assert r.u == 3
    n = 8
    var = 16 / 12 * ((n + 1) - (2 * (27 - 3)) / (n * (n - 1)))
    assert r.z == pytest.approx(-(abs(3 - 8) - 0.5) / math.sqrt(var))


@pytest.mark.parametrize("seed,n1,n2,shift,ties,p_scipy", [
    # p-values from scipy.stats.mannwhitneyu(x, y) 1.17.1 on the same draws: method="exact" for the
    # first (no ties, a sample of <= 8, as scipy's "auto"), method="asymptotic" for the others
    (1, 5, 7, 0.3, False, 0.8762626262626263),
    (2, 30, 40, 0.3, True, 0.055075407484131034),
    (3, 200, 150, 0.3, True, 0.027736830787877906),
    (4, 10, 10, 0.0, True, 0.4959675729800952),  # C(20, 10) splits: over the exact-with-ties limit
])
def test_mwu_matches_scipy(seed, n1, n2, shift, ties, p_scipy):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, n1)
    y = rng.normal(shift, 1, n2)
    if ties:  # rounding to 0.1 makes many ties
        x, y = np.round(x, 1), np.round(y, 1)
    assert cmp.mann_whitney_u(x, y).p == pytest.approx(p_scipy, rel=1e-12)


def test_mwu_symmetry_and_u_sum():
    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 1, 30), rng.normal(0.5, 1, 40)
    a, b = cmp.mann_whitney_u(x, y), cmp.mann_whitney_u(y, x)
    assert a.u + b.u == 30 * 40
    assert a.p == pytest.approx(b.p)
    assert a.z == pytest.approx(-b.z)


def test_mwu_all_tied_is_p_one():
    assert cmp.mann_whitney_u([2.0] * 5, [2.0] * 7).p == 1.0
    assert cmp.mann_whitney_u([1.0], [1.0]).p == 1.0


def test_mwu_empty_raises():
    with pytest.raises(ValueError):
        cmp.mann_whitney_u([], [1.0])


def test_mwu_false_positive_rate_is_near_alpha():
    # Same distribution on both sides: at alpha = 0.05 about 5% of tests reject.
    rng = np.random.default_rng(7)
    rejections = sum(cmp.mann_whitney_u(rng.normal(0, 1, 30), rng.normal(0, 1, 30)).p < 0.05 for _ in range(400))
    assert 0.02 <= rejections / 400 <= 0.09


# ---- verdicts on samples from known distributions ----

def _values(res: Result) -> list[list[float]]:
    return [cmp.figure_values(r) for r in res.records]


def test_same_distribution_is_same_for_every_figure():
    c = cmp.compare(synth.copy_like(1), synth.copy_like(2), threshold_pct=1.0)
    assert [r.verdict for r in c.rows] == ["same"] * 6
    assert all(abs(r.change_pct) < 1.0 for r in c.rows)


def test_five_percent_drop_is_worse_with_change_near_minus_five():
    c = cmp.compare(synth.copy_like(1), synth.copy_like(2, scale=0.95), threshold_pct=2.0)
    assert [r.verdict for r in c.rows] == ["slower"] * 6
    for r in c.rows:
        assert r.change_pct == pytest.approx(-5.0, abs=1.0)
        assert r.p < 1e-6
    assert len(c.regressions()) == 6


def test_five_percent_gain_is_better_and_threshold_hides_it():
    better = cmp.compare(synth.copy_like(1), synth.copy_like(2, scale=1.05), threshold_pct=2.0)
    assert {r.verdict for r in better.rows} == {"faster"}
    hidden = cmp.compare(synth.copy_like(1), synth.copy_like(2, scale=1.05), threshold_pct=10.0)
    assert {r.verdict for r in hidden.rows} == {"same"}


def test_noisy_five_percent_drop_is_never_called_a_change_nor_same_when_beyond_the_threshold():
    # cv 30% and 6 samples: a 5% drop cannot be told from noise; a change estimated beyond the
    # threshold is "inconclusive", one within it "same"; never "slower"
    c = cmp.compare(synth.copy_like(1, cv=0.3, n=6), synth.copy_like(2, scale=0.95, cv=0.3, n=6), threshold_pct=2.0)
    for r in c.rows:
        assert r.verdict == ("same" if abs(r.change_pct) <= 2.0 else "inconclusive"), r
        assert r.ci_low_pct < 0 < r.ci_high_pct  # the interval says: could be either way


def test_detection_power_over_many_draws():
    # 5% drop, cv 2%, 20 samples a side: found in (nearly) every draw; equal distributions almost never flagged.
    worse = same_flagged = 0
    for seed in range(40):
        a = synth.copy_like(seed, cv=0.02, n=20, sizes=(2**30,), median_gbps=(55.0,))
        b = synth.copy_like(1000 + seed, cv=0.02, n=20, sizes=(2**30,), median_gbps=(55.0,), scale=0.95)
        c = synth.copy_like(2000 + seed, cv=0.02, n=20, sizes=(2**30,), median_gbps=(55.0,))
        worse += sum(r.verdict == "slower" for r in cmp.compare(a, b, threshold_pct=2.0).rows)
        same_flagged += sum(r.verdict in ("faster", "slower") for r in cmp.compare(a, c, threshold_pct=0.0).rows)
    assert worse >= 78  # of 80 figures
    assert same_flagged <= 4  # alpha 0.01 on 80 figures: ~0.8 expected


def test_time_metric_lower_is_better():
    rng = np.random.default_rng(5)
    base = Result("p2p", {}, records=[Record({"test": "latency"}, metric="time", nbytes=4,
                                             samples_s=list(2e-6 * np.exp(rng.normal(0, 0.01, 40))))])
    slow = Result("p2p", {}, records=[Record({"test": "latency"}, metric="time", nbytes=4,
                                             samples_s=list(2.2e-6 * np.exp(rng.normal(0, 0.01, 40))))])
    (row,) = cmp.compare(base, slow, threshold_pct=2.0).rows
    assert row.verdict == "slower" and row.change_pct == pytest.approx(10, abs=1.5)
    assert row.ci_low_pct < 10 < row.ci_high_pct
    (row,) = cmp.compare(slow, base, threshold_pct=2.0).rows
    assert row.verdict == "faster"


# ---- pairing on the real H200 results ----

def test_real_result_against_itself_is_all_same():
    r = load(synth.REAL_PINNED)
    c = cmp.compare(r, r)
    assert c.counts() == {"faster": 0, "slower": 0, "same": 20, "inconclusive": 0, "undecidable": 0,
                          "only-base": 0, "only-new": 0, "no-data": 0}
    assert c.missing() == []
    assert all(row.change_pct == 0 and row.p == 1.0 for row in c.rows)
    assert c.env_diff == []


def test_an_older_net_result_pairs_as_tcp_over_host_memory_never_with_a_ucx_one():
    """net records gained "protocol" and "memory" (--protocol ucx, -m): an older one measured tcp, host."""
    def net(**params):
        recs = [Record({"streams": 1, "stream": "total", "direction": "c2s", **params}, nbytes=10**6,
                       samples_s=[r * 1e-3 for r in (1.0, 1.01, 0.99, 1.02, 0.98)])]
        return Result("net", {}, records=recs)

    old = net()
    c = cmp.compare(old, net(protocol="tcp", memory="host"))
    assert c.counts()["same"] == 1 and any("memory host, protocol tcp" in n for n in c.notes), c.notes
    c = cmp.compare(old, net(protocol="ucx", memory="host", api="tag"))
    assert c.counts()["only-base"] == 1 and c.counts()["only-new"] == 1
    c = cmp.compare(net(protocol="ucx", memory="host", api="tag"), net(protocol="ucx", memory="cuda", api="tag"))
    assert c.counts()["only-base"] == 1 and c.counts()["only-new"] == 1


def test_a_record_param_an_older_result_lacks_pairs_only_with_its_older_behaviour_value():
    """net records gained "direction" (-R/--bidir): an older record (no key) measured c2s."""
    def net(direction, *ratios, command="net"):
        recs = [Record({"streams": 1, "stream": s, "protocol": "tcp", "memory": "host",
                        **({"direction": direction} if direction else {})},
                       nbytes=10**9, samples_s=[r * 0.1 for r in (1.0, 1.01, 0.99, 1.02, 0.98)])
                for s, _ in zip((0, "total"), range(2))]
        return Result(command, {}, records=recs)

    old = net(None)
    c = cmp.compare(old, net("c2s"))
    assert c.counts()["same"] == 2 and not c.missing(), c.counts()
    assert all(r.params["direction"] == "c2s" for r in c.rows)
    assert any("base has records without param(s) direction" in n and "direction c2s" in n for n in c.notes)
    c = cmp.compare(net("c2s"), old)  # either side may be the older one
    assert c.counts()["same"] == 2 and any(n.startswith("new has records without") for n in c.notes)
    # strict otherwise: another direction, or the key on both sides at different values, never pairs
    for a, b in ((old, net("s2c")), (net("s2c"), old), (net("c2s"), net("s2c"))):
        c = cmp.compare(a, b)
        assert c.counts()["only-base"] == 2 and c.counts()["only-new"] == 2, c.counts()
    # both sides with the key: nothing filled, no note
    assert not cmp.compare(net("c2s"), net("c2s")).notes
    # only net's records are filled
    c = cmp.compare(net(None, command="copy"), net("c2s", command="copy"))
    assert c.counts()["only-base"] == 2 and not any("records without" in n for n in c.notes)
    assert c.notes == ["no figure pairs: the results differ in direction: base -, new c2s; --ignore-param "
                       "direction pairs figures that differ only there"]


def test_when_nothing_pairs_a_param_an_older_result_lacks_is_not_named_as_the_difference():
    """An older net result (no "direction": it pairs as c2s) against a c2s run with another -P: the
    note names streams and the option that pairs them, not direction, which --ignore-param would not
    help with."""
    def net(streams, direction=None):
        return Result("net", {}, records=[
            Record({"streams": streams, "stream": s, **({"direction": direction} if direction else {})},
                   nbytes=10**9, samples_s=[0.1, 0.101, 0.099]) for s in (0, "total")])

    c = cmp.compare(net(2), net(1, "c2s"))
    assert c.counts()["only-base"] == 2 and c.counts()["only-new"] == 2, c.counts()
    assert ("no figure pairs: the results differ in streams: base 2, new 1; --ignore-param streams pairs "
            "figures that differ only there") in c.notes
    assert cmp.compare(net(2), net(1, "c2s"), ignore=["streams"]).counts()["only-base"] == 0


def test_env_diff_skips_net_options_an_older_result_lacks_at_their_older_behaviour_value():
    a, b = Result("net", {"streams": 1}), Result("net", {"streams": 1, "direction": "c2s", "window": 0,
                                                           "bitrate": 0, "family": 0, "copy": False})
    # copy false is zero copy; the older net sent from and received into buffers (copy true)
    assert [w for w, *_ in cmp.env_diff(a, b) if w.startswith("option")] == ["option copy"]
    b.spec = dict(b.spec, direction="both")
    assert ("option direction", "null", "both") in cmp.env_diff(a, b)


def test_real_results_pair_shared_points_and_list_one_sided_ones():
    a, b = load(synth.REAL_PINNED), load(synth.REAL_ALL)
    c = cmp.compare(a, b)
    counts = c.counts()
    # shared: pinned h2d/d2h at 4 KiB, 64 KiB, 1 MiB, 16 MiB, 256 MiB
    assert counts["faster"] + counts["slower"] + counts["same"] + counts["inconclusive"] == 10
    assert counts["only-base"] == 10 and counts["only-new"] == 90
    paired = {(r.params["direction"], r.params["nbytes"]) for r in c.rows if r.status == "paired"}
    assert paired == {(d, n) for d in ("h2d", "d2h") for n in (4096, 65536, 2**20, 2**24, 2**28)}
    assert [r.status for r in c.rows][-90:] == ["only-new"] * 90
    what = [w for w, _, _ in c.env_diff]
    assert "option memory" in what and "option directions" in what


def test_env_diff_names_driver_gpu_and_host():
    a = synth.copy_like(1)
    b = synth.copy_like(2)
    b.env = dict(b.env, nvml=dict(b.env["nvml"], driver_version="590.10"), host=dict(b.env["host"], hostname="node7"),
                 gpus=[{"name": "NVIDIA H100", "pcie_gen": 4, "pcie_width": 16}])
    diff = {w: (x, y) for w, x, y in cmp.env_diff(a, b)}
    assert diff["NVIDIA driver"] == ("580.159.04", "590.10")
    assert diff["hostname"] == ("vm", "node7")
    assert diff["GPUs"] == ("-", "NVIDIA H100")
    assert diff["PCIe link (now)"] == ("-", "Gen4 x16")


def test_env_diff_skips_an_option_an_older_result_lacks_at_its_off_value_and_shows_the_buffers():
    a, b = synth.copy_like(1), synth.copy_like(2)
    a.command = b.command = "nccl"
    b.spec = dict(b.spec, cuda_graph=0)  # added after nccl results were saved; 0 = as before
    assert not [w for w, *_ in cmp.env_diff(a, b) if w.startswith("option")]
    b.spec = dict(b.spec, cuda_graph=10)  # on: a real difference
    assert ("option cuda_graph", "null", "10") in cmp.env_diff(a, b)
    b.spec = dict(b.spec, cuda_graph=0, gate=False)  # an unknown key at a falsy value is still shown
    assert [w for w, *_ in cmp.env_diff(a, b) if w.startswith("option")] == ["option gate"]
    a.timing = dict(a.timing, buffers="cudaMalloc")
    b.timing = dict(b.timing, buffers="ncclMemAlloc")
    assert ("timing buffers", "cudaMalloc", "ncclMemAlloc") in cmp.env_diff(a, b)


def test_env_diff_names_a_different_nccl_or_nccl_variables():
    a, b = synth.copy_like(1), synth.copy_like(2)
    a.env = dict(a.env, nccl={"version": 22803, "env": {"NCCL_NVLS_ENABLE": "0"}})
    b.env = dict(b.env, nccl={"version": 22809, "env": {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Ring"}})
    diff = {w: (x, y) for w, x, y in cmp.env_diff(a, b)}
    assert diff["NCCL"] == ("2.28.3", "2.28.9")
    assert diff["NCCL_* variables"] == ("NCCL_NVLS_ENABLE=0", "NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0")
    b.env = dict(b.env, nccl=dict(a.env["nccl"]))
    assert not [w for w, *_ in cmp.env_diff(a, b) if w.startswith("NCCL")]


@pytest.mark.parametrize("code, text", [(22809, "2.28.9"), (21903, "2.19.3"), (20900, "2.9.0"),
                                        (2804, "2.8.4"), (2708, "2.7.8"), (None, "-"), ("2.28.9", "2.28.9"),
                                        (True, "True"), (7, "7")])
def test_nccl_version_code_reads_as_nccl_writes_it(code, text):
    # nccl.h's NCCL_VERSION_CODE: major*10000 + minor*100 + patch from 2.9, major*1000 + ... before
    assert cmp.nccl_version_text(code) == text


def test_a_failed_point_is_no_data_with_its_reason():
    a, b = synth.copy_like(1), synth.copy_like(2)
    b.records[0] = Record(dict(b.records[0].params), nbytes=b.records[0].nbytes, error="allocation failed")
    c = cmp.compare(a, b)
    assert c.rows[0].status == "no-data" and c.rows[0].verdict == "" and "allocation" in c.rows[0].note
    assert c.rows[0].base_median is not None and c.rows[0].new_median is None


def test_different_commands_refused():
    with pytest.raises(UsageError, match="'merge' result"):
        cmp.compare(synth.copy_like(1), synth.merge_like(1))


def test_impossible_samples_refused():
    a = synth.copy_like(1)
    b = synth.copy_like(2)
    b.records[0].samples_s[3] = 0.0
    with pytest.raises(UsageError, match="sample of 0.0 seconds"):
        cmp.compare(a, b)


def test_markdown_and_json_forms():
    c = cmp.compare(synth.copy_like(1), synth.copy_like(2, scale=0.95), threshold_pct=2.0)
    md = cmp.format_markdown([c], threshold_pct=2.0, alpha=0.01)
    assert md[0] == "### gpubench copy: new vs base base"
    assert "**6 figure(s) slower.**" in md[2]
    header = next(line for line in md if line.startswith("| direction"))
    assert header == "| direction | nbytes | base GB/s | new GB/s | n base/new | change | 99% interval | p | verdict |"
    assert sum("**slower**" in line for line in md) == 6
    assert md[-1].startswith("<sub>verdict: same when") and "higher is better" in md[-1]
    assert "lower is better" not in md[-1]  # only bandwidths were compared
    j = cmp.format_json([c], threshold_pct=2.0, alpha=0.01)
    assert j["regressions"] == 6 and j["comparisons"][0]["counts"]["slower"] == 6


# ---- small samples and missing figures (a CI gate must not pass a 50 % drop or an empty run) ----

def _res(samples_by_size, command="nccl"):
    return Result(command, {}, records=[Record({"nbytes": n}, nbytes=n, samples_s=list(s))
                                        for n, s in samples_by_size.items()])


def test_three_runs_cannot_be_tested_so_a_big_drop_is_undecidable_not_slower():
    base = _res({1: [1.00, 1.01, 0.99]})
    slow = _res({1: [2.00, 2.02, 1.98]})  # half the bandwidth
    c = cmp.compare(base, slow)
    (row,) = c.rows
    assert row.p == pytest.approx(0.1)  # the least 3 vs 3 can give
    assert row.verdict == "undecidable" and c.regressions() == [] and c.undecidable() == [row]
    assert "cannot reach p < 0.01" in row.why and "it takes 5 vs 5" in row.why
    assert row.ci_low_pct is None  # 3 vs 3 has no 99% interval
    (row,) = cmp.compare(slow, base).rows
    assert row.verdict == "undecidable"
    (row,) = cmp.compare(base, _res({1: [1.001, 1.011, 0.991]})).rows  # inside the 1 % threshold
    assert row.verdict == "same"


def test_five_samples_separated_are_worse_at_the_default_alpha():
    base = _res({1: [1.00, 1.01, 0.99, 1.02, 0.98]})
    slow = _res({1: [2.00, 2.01, 1.99, 2.02, 1.98]})
    (row,) = cmp.compare(base, slow).rows
    assert row.p == pytest.approx(2 / 252) and row.verdict == "slower"


def test_figures_missing_from_the_new_result_are_listed():
    base = _res({1: [1.0, 1.1, 0.9], 2: [1.0, 1.1, 0.9]})
    new = Result("nccl", {}, records=[Record({"nbytes": 1}, nbytes=1, error="out of memory")])
    c = cmp.compare(base, new)
    assert {r.params["nbytes"] for r in c.missing()} == {1, 2}
    assert cmp.compare(base, base).missing() == []
    assert cmp.compare(new, base).missing() == []  # the new result has more: nothing is missing


def test_two_net_local_runs_do_not_differ_by_their_random_ports():
    from gpubench.plugins.net import bench as net

    req = net.Request(streams=1, seconds=0.3, omit=0.0, interval=0.1)
    a, b = net.run_local(req), net.run_local(req)
    assert a.spec["port"] == b.spec["port"] == 0  # asked: any free port
    assert a.timing["server_port"] > 0 and b.timing["server_port"] > 0
    assert not [w for w, *_ in cmp.env_diff(a, b) if w.startswith("option")]


def test_nccl_comparisons_say_the_rates_are_algbw_and_busbw_moves_with_them():
    from gpubench.plugins.nccl import bench as N

    spec = N.NcclSpec(sizes=(1 << 20,), places=("out-of-place",))

    def res(t):
        return Result("nccl", spec.to_dict(), records=N.to_records(spec, [N.Point(1 << 20, 1 << 18, "out-of-place",
                                                                                  [t] * 5, 0)], 4))

    c = cmp.compare(res(1e-4), res(1e-4))
    assert any("algbw = S/t" in n and "algbw * 2(n-1)/n" in n for n in c.notes)
    assert not any("algbw" in n for n in cmp.compare(synth.copy_like(1), synth.copy_like(2)).notes)


# ---- the Hodges-Lehmann change and its Moses interval ----

def _brute_shift(x, y, alpha):
    d = np.sort(np.subtract.outer(np.log(y), np.log(x)).ravel())
    c = cmp.moses_rank(len(x), len(y), alpha)
    hl = np.median(d)
    lo, hi = (d[c - 1], d[len(d) - c]) if c else (None, None)
    return hl, lo, hi


@pytest.mark.parametrize("seed,m,n,ties", [(0, 5, 5, False), (1, 7, 12, True), (2, 40, 31, False),
                                           (3, 250, 200, True), (4, 300, 260, False)])
def test_hodges_lehmann_matches_sorting_every_pairwise_difference(seed, m, n, ties):
    # the last two have over BRUTE_MAX_PAIRS pairs: the bisection selection, never listing them
    rng = np.random.default_rng(seed)
    x = np.exp(rng.normal(0, 0.05, m))
    y = np.exp(rng.normal(-0.03, 0.05, n))
    if ties:
        x, y = np.round(x, 2), np.round(y, 2)
    s = cmp.hodges_lehmann(list(x), list(y), 0.05)
    hl, lo, hi = _brute_shift(x, y, 0.05)
    assert s.change_pct == pytest.approx(100 * math.expm1(hl), abs=1e-9)
    assert s.ci_low_pct == pytest.approx(100 * math.expm1(lo), abs=1e-9)
    assert s.ci_high_pct == pytest.approx(100 * math.expm1(hi), abs=1e-9)


def test_moses_rank_by_hand():
    # 5 vs 5: P(U <= 2) = 4/252 = 0.016 <= 0.025 < P(U <= 3) = 7/252: the 95% interval is [D_(3), D_(23)]
    # (Hollander & Wolfe's table: the rank-sum critical value 38 of m = n = 5 gives C = 3)
    assert cmp.moses_rank(5, 5, 0.05) == 3
    assert cmp.moses_rank(5, 5, 0.01) == 1  # P(U <= 0) = 1/252 <= 0.005 < 2/252
    assert cmp.moses_rank(3, 3, 0.01) == 0  # no 99% interval: 1/20 > 0.005
    # the normal approximation beyond EXACT_CI_MAX_PAIRS agrees with the exact count near it
    exact = cmp.moses_rank(20, 20, 0.05)
    approx = math.floor(200 - 1.959964 * math.sqrt(400 * 41 / 12))
    assert abs(exact - approx) <= 1


def test_moses_interval_covers_the_true_ratio_at_its_level():
    rng = np.random.default_rng(11)
    hits = 0
    for _ in range(300):
        x = np.exp(rng.normal(0, 0.1, 10))
        y = 0.9 * np.exp(rng.normal(0, 0.1, 12))  # true ratio 0.9: -10%
        s = cmp.hodges_lehmann(list(x), list(y), 0.05)
        hits += s.ci_low_pct <= -10.0 <= s.ci_high_pct
    assert 0.92 <= hits / 300 <= 0.99  # >= 95% by construction (discreteness makes it a bit over)


def test_a_bandwidth_change_is_the_inverse_of_its_time_change():
    rng = np.random.default_rng(2)
    tb, tn = list(np.exp(rng.normal(0, 0.02, 9))), list(1.25 * np.exp(rng.normal(0, 0.02, 9)))
    time_shift = cmp.hodges_lehmann(tb, tn)
    rate_shift = cmp.hodges_lehmann([1 / t for t in tb], [1 / t for t in tn])
    assert (1 + rate_shift.change_pct / 100) * (1 + time_shift.change_pct / 100) == pytest.approx(1.0)


def test_exact_ties_by_dynamic_programming_match_enumerating_every_split():
    import itertools

    rng = np.random.default_rng(5)
    for _ in range(30):
        x = list(np.round(rng.normal(0, 1, 6), 0))
        y = list(np.round(rng.normal(0.5, 1, 7), 0))
        r = cmp.mann_whitney_u(x, y)
        if r.method != "exact (ties)":
            continue
        ranks, _ = cmp._ranks(x + y)
        mu, far = 6 * 7 / 2, abs(r.u - 6 * 7 / 2) - 1e-9
        us = [sum(ranks[i] for i in idx) - 21 for idx in itertools.combinations(range(13), 6)]
        assert r.p == pytest.approx(min(1.0, sum(abs(u - mu) >= far for u in us) / len(us)))


# ---- verdicts on constructed samples (what a CI user reads) ----

def _net(samples_by_stream, command="net"):
    """A net-shaped result: one bandwidth figure per stream, each sample an interval's seconds for 1 GB."""
    return Result(command, {}, records=[Record({"stream": k}, nbytes=10**9, samples_s=[10**9 / v for v in vals])
                                        for k, vals in samples_by_stream.items()])


NET_BASE = [9.40, 9.55, 9.60, 9.70, 9.85]  # Gbit-ish rates of five intervals (any unit: only ratios matter)
NET_DROP = [7.10, 7.20, 7.30, 9.45, 9.50]  # two intervals about as fast as the base, three far slower


def test_five_against_five_at_minus_24_percent_with_p_0_032_is_inconclusive_never_same():
    """Two 5-interval net runs, a -24% change, p = 0.032: inconclusive, never "same"."""
    c = cmp.compare(_net({0: NET_BASE}), _net({0: NET_DROP}))
    (row,) = c.rows
    assert row.p == pytest.approx(8 / 252)  # U = 2 of 25: exact p = 2 * 4/252 = 0.032
    assert row.change_pct == pytest.approx(-24, abs=1.5)
    assert row.verdict == "inconclusive" and "0.032 >= alpha 0.01" in row.why
    assert (row.n_base, row.n_new) == (5, 5)
    assert row.ci_low_pct < -24 < row.ci_high_pct
    assert c.regressions() == [] and c.inconclusive() == [row]
    md = "\n".join(cmp.format_markdown([c], threshold_pct=1, alpha=0.01))
    assert "**inconclusive**" in md and "| 5/5 |" in md and "same |" not in md
    # at alpha 0.05 the same samples are a regression
    (row,) = cmp.compare(_net({0: NET_BASE}), _net({0: NET_DROP}), alpha=0.05).rows
    assert row.verdict == "slower"


def test_identical_runs_are_same_with_a_zero_change():
    a = _net({0: NET_BASE, 1: NET_DROP})
    c = cmp.compare(a, a)
    assert [r.verdict for r in c.rows] == ["same", "same"]
    for r in c.rows:
        assert r.change_pct == 0.0 and r.p == 1.0 and r.ci_low_pct <= 0 <= r.ci_high_pct


def test_a_clear_regression_is_slower_with_an_interval_below_zero():
    base = [100.0, 100.4, 99.8, 100.2, 99.9, 100.1, 100.3, 99.7]
    new = [v * 0.9 for v in base]
    (row,) = cmp.compare(_net({0: base}), _net({0: new})).rows
    assert row.verdict == "slower" and row.p < 0.01
    assert row.change_pct == pytest.approx(-10, abs=0.01) and row.ci_high_pct < 0
    (row,) = cmp.compare(_net({0: new}), _net({0: base})).rows
    assert row.verdict == "faster" and row.ci_low_pct > 0


def test_a_large_noisy_change_is_inconclusive():
    base = [0.5, 0.7, 0.9, 1.1, 1.3, 1.5, 1.7, 1.9, 2.1, 2.3]
    new = [0.8 * v for v in base]  # -20%, but the spread is ±60%
    (row,) = cmp.compare(_net({0: base}), _net({0: new})).rows
    assert row.change_pct == pytest.approx(-20, abs=1e-9)
    assert row.p > 0.1 and row.verdict == "inconclusive"
    assert row.ci_low_pct < -20 < row.ci_high_pct and row.ci_high_pct > 0


def test_time_figures_say_lower_is_better_and_bandwidth_only_footers_do_not():
    t = Result("p2p", {}, records=[Record({"test": "latency"}, metric="time", nbytes=4,
                                          samples_s=[2e-6, 2.01e-6, 1.99e-6, 2.02e-6, 1.98e-6])])
    c = cmp.compare(t, t)
    lines = [str(x) for x in cmp.format_table([c], threshold_pct=1, alpha=0.01, units="GB")]
    assert any("time in us: lower is better" in x for x in lines)
    assert not any("higher is better" in x for x in lines)
    b = cmp.compare(_net({0: NET_BASE}), _net({0: NET_BASE}))
    lines = [str(x) for x in cmp.format_table([b], threshold_pct=1, alpha=0.01, units="GB")]
    assert any("bandwidth in GB/s (1e9 B/s): higher is better" in x for x in lines)
    assert not any("lower is better" in x for x in lines)
    assert cmp.compare(t, t).rows[0].to_dict()["better"] == "lower"
    assert b.rows[0].to_dict()["unit"] == "B/s" and b.rows[0].to_dict()["better"] == "higher"


def test_the_undecided_lines_are_sentences_naming_the_sizes_and_the_commands_own_sample_options():
    def res(command, n_figs, scale, samples=(0.1, 0.11)):
        return Result(command, {}, records=[Record({"stream": s}, nbytes=10**9, samples_s=[scale * x for x in samples])
                                            for s in range(n_figs)])
    c = cmp.compare(res("net", 3, 1.0), res("net", 3, 2.0))
    assert cmp.undecided_lines(c) == [
        "3 figures undecidable; the first: 2 vs 2 samples cannot reach p < 0.01 (best 0.333): it takes 5 vs 5 "
        "or 2 vs 19. "
        "To decide them, take more intervals (net's samples are its intervals): a longer -t (seconds) "
        "or a shorter -i (interval)."]
    one = cmp.undecided_lines(cmp.compare(res("nccl", 1, 1.0), res("nccl", 1, 2.0)))[0]
    assert one.startswith("1 figure undecidable: 2 vs 2 samples") and "take more samples per point: --samples N" in one
    assert "--max-noise" in cmp.more_samples_hint("copy") and "--max-noise" not in cmp.more_samples_hint("overlap")
    assert cmp.more_samples_hint("someday") == "more samples per figure"
    assert cmp.undecided_lines(cmp.compare(res("net", 2, 1.0), res("net", 2, 1.0))) == []
    # enough samples to decide, but overlapping: inconclusive, its own sentence
    wide = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
    lines = cmp.undecided_lines(cmp.compare(res("net", 1, 1.0, wide), res("net", 1, 1.1, wide)))
    assert len(lines) == 1 and lines[0].startswith("1 figure inconclusive: p = ")


@pytest.mark.parametrize("m,n,alpha,needed", [
    (3, 3, 0.01, (5, 9)),    # 2 / C(10, 5) = 0.0079; beside 3 base samples: 2 / C(12, 3) = 0.0091
    (2, 2, 0.01, (5, 19)),   # 2 / C(21, 2) = 0.0095
    (1, 1, 0.01, (5, 200)),  # one base sample: the smallest p is 2 / (n + 1), under 0.01 from n = 200
    (1, 1, 1e-9, (26, None)),  # ... never under 1e-9 within SAMPLES_SEARCH_MAX (26 a side: normal approximation)
    (5, 5, 0.05, (4, 5)),    # 2 / C(8, 4) = 0.029 already; 5 vs 5 can reach it
])
def test_samples_needed_are_the_smallest_sizes_whose_best_p_is_under_alpha(m, n, alpha, needed):
    k, n2 = cmp.samples_needed(m, n, alpha)
    assert (k, n2) == needed
    assert cmp.min_p(k, k) < alpha <= cmp.min_p(k - 1, k - 1)
    if n2 is not None and n2 > n:
        assert cmp.min_p(m, n2) < alpha <= cmp.min_p(m, n2 - 1)


def test_a_change_the_sizes_cannot_decide_is_undecidable_and_a_slowdown_among_them_is_named():
    def res(scale, runs=3):
        return Result("merge", {}, records=[Record({"run": "all"}, metric="time",
                                                   samples_s=[scale * (1 + i / 100) for i in range(runs)])])
    c = cmp.compare(res(1.0), res(1.7))  # 70% slower in time, 3 runs a side: best p 0.1
    row = c.rows[0]
    assert row.verdict == cmp.UNDECIDABLE and "it takes 5 vs 5 or 3 vs 9" in row.why
    assert c.undecidable(slower_only=True) == [row] and c.regressions() == [] and c.inconclusive() == []
    faster = cmp.compare(res(1.7), res(1.0))
    assert faster.rows[0].verdict == cmp.UNDECIDABLE and faster.undecidable(slower_only=True) == []
    decided = cmp.compare(res(1.0, 5), res(1.7, 5))
    assert decided.rows[0].verdict == cmp.SLOWER


# ---- telemetry differences and limit flags beside the figures ----

def _tele(sm, power, temp, reasons, gen=5):
    return {"n": 20, "interval_s": 0.01, "sm_clock_mhz": {"min": sm - 10, "median": sm, "max": sm + 5},
            "mem_clock_mhz": {"min": 2619, "median": 2619, "max": 2619}, "power_w": {"min": 100, "median": power,
                                                                                   "max": power + 5},
            "temp_c": {"min": temp, "median": temp, "max": temp}, "reasons": reasons,
            "pcie": {"gen": gen, "width": 16}, "pcie_replay_delta": 0, "nvlink_errors_delta": 0}


def test_telemetry_differences_are_shown_beside_the_figure():
    a, b = _net({0: NET_BASE}), _net({0: NET_BASE})
    a.records[0].extra["telemetry"] = _tele(1980, 300, 40, [])
    b.records[0].telemetry = _tele(1410, 700, 52, ["sw_power_cap"], gen=4)  # the field the telemetry branch adds
    (row,) = cmp.compare(a, b).rows
    assert row.telemetry == ["SM clock 1980->1410 MHz", "power 300->700 W", "temperature 40->52 C",
                             "new only: sw_power_cap", "PCIe Gen5 x16->Gen4 x16"]
    cols, body = cmp.table_rows(cmp.compare(a, b))
    assert cols[-1] == "telemetry (base->new)" and "SM clock 1980->1410 MHz" in body[0][-1]
    b.records[0].telemetry = _tele(1975, 302, 41, [])  # within the tolerances: nothing to say
    assert cmp.compare(a, b).rows[0].telemetry == []
    assert "telemetry (base->new)" not in cmp.table_rows(cmp.compare(a, b))[0]


@pytest.mark.parametrize("bad", ["hot", 7, {"sm_clock_mhz": "fast", "reasons": "power"}, {"power_w": {"median": True}},
                                 {"sm_clock_mhz": {"median": float("nan")}}, {"pcie": [5, 16]}, None])
def test_malformed_telemetry_is_ignored_not_raised(bad):
    a, b = _net({0: NET_BASE}), _net({0: NET_BASE})
    a.records[0].extra["telemetry"] = _tele(1980, 300, 40, [])
    b.records[0].extra["telemetry"] = bad
    assert cmp.compare(a, b).rows[0].telemetry == []


def test_limit_flags_from_the_records_are_shown():
    a, b = _net({0: NET_BASE}), _net({0: NET_BASE})
    b.records[0].extra.update(above_limit=True, flags=["one-rank no-op", {"not": "text"}])
    (row,) = cmp.compare(a, b).rows
    assert row.flags == ["new above a physical limit", "new: one-rank no-op"]
    cols, body = cmp.table_rows(cmp.compare(a, b))
    assert cols[-1] == "flags" and body[0][-1] == "new above a physical limit; new: one-rank no-op"
    a.records[0].extra["above_peak"] = True  # copy's existing flag
    assert cmp.compare(a, b).rows[0].flags[0] == "base above a physical limit"


# ---- strings from result files are inert in the table, the markdown and error lines ----

PAYLOADS = {
    "ansi": "\x1b[2J\x1b[31mred",
    "osc8": "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "crlf": "a\r\nfake | row | here\n| x |",
    "markup": "[bold red]loud[/bold red]",
    "link": "[link=http://evil.example/]here[/link]",
    "close": "[/]",
    "html": "<img src=x onerror=alert(1)>",
}


def _hostile(payload: str) -> tuple[Result, Result]:
    def res(scale):
        r = _net({0: [v * scale for v in NET_BASE]})
        r.records[0].params = {payload: payload, "stream": 0}
        r.records.append(Record({payload: payload, "stream": 1}, nbytes=1, error=payload))
        r.records[0].extra.update(flags=[payload], telemetry=_tele(1980, 300, 40, [payload]))
        r.env = {"host": {"hostname": payload}, "versions": {payload: payload}}
        r.partial, r.failed_by = True, payload
        return r

    a, b = res(1.0), res(0.5)
    b.records[0].extra["telemetry"] = _tele(1410, 300, 40, [payload + "!"])
    return a, b


def _rich_text(renderables) -> str:
    import io

    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, color_system=None, width=400, force_terminal=False, highlight=False)
    for r in renderables:
        con.print(r)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_hostile_strings_are_inert_in_the_terminal_table(name):
    payload = PAYLOADS[name]
    a, b = _hostile(payload)
    c = cmp.compare(a, b, base_name=payload, new_name=payload + ".json")
    text = _rich_text(cmp.format_table([c], threshold_pct=1, alpha=0.01))  # a [/] would raise MarkupError
    assert "\x1b" not in text and "\r" not in text
    assert "http://evil" not in text or "[link=" in text or "\\x1b]8" in text  # shown, never a hyperlink
    if name in ("markup", "link", "close"):
        assert payload in text  # shown as written, not interpreted
    if name == "crlf":
        assert "a\\r\\nfake" in text


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_the_summary_line_names_the_worst_figure_inertly_in_the_terminal_table(name):
    """The summary line names the worst figure by the params that tell figures apart: a hostile
    value there is escaped as in the table's cells (one line, no escape sequence), not written raw."""
    payload = PAYLOADS[name]
    base = _net({0: NET_BASE, 1: NET_BASE})
    new = _net({0: [v / 2 for v in NET_BASE], 1: NET_BASE})
    for r in (base, new):
        r.records[0].params["stream"] = payload
    c = cmp.compare(base, new)
    text = _rich_text(cmp.format_table([c], threshold_pct=1, alpha=0.01))
    assert "\x1b" not in text and "\r" not in text
    summary = next(line for line in text.splitlines() if "figure(s) paired" in line)
    assert "(worst: stream " in summary and "-50.00%)" in summary  # the whole figure on the one line


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_hostile_strings_are_inert_in_the_markdown(name):
    payload = PAYLOADS[name]
    a, b = _hostile(payload)
    c = cmp.compare(a, b, base_name=payload, new_name=payload)
    lines = cmp.format_markdown([c], threshold_pct=1, alpha=0.01)
    text = "\n".join(lines)
    assert "\x1b" not in text and "\r" not in text
    assert "<img" not in text and "](" not in text
    assert all("\n" not in line for line in lines)
    import re

    for table in (l for l in lines if l.startswith("|")):  # every row of a table has its columns, no more
        cells = re.split(r"(?<!\\)\|", table)
        head = next(l for l in lines if l.startswith("|") and lines.index(l) <= lines.index(table)
                    and (lines.index(l) == 0 or not lines[lines.index(l) - 1].startswith("|")))
        assert len(cells) == len(re.split(r"(?<!\\)\|", head)), table


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_hostile_strings_are_inert_in_error_lines(name):
    payload = PAYLOADS[name]
    a, b = _hostile(payload)
    b.command = payload
    with pytest.raises(UsageError) as e:
        cmp.compare(a, b, base_name=payload, new_name=payload)
    msg = e.value.one_line()
    assert "\x1b" not in msg and "\n" not in msg and "\r" not in msg
    a2, b2 = _hostile(payload)
    b2.records[0].metric = "time"
    with pytest.raises(UsageError) as e:
        cmp.compare(a2, b2, base_name=payload, new_name=payload)
    assert "\x1b" not in e.value.one_line() and "\n" not in e.value.one_line()


def test_a_large_comparison_lists_the_changed_rows_and_counts_the_rest():
    recs = [Record({"i": i}, nbytes=1, samples_s=[1.0, 1.01, 0.99, 1.02, 0.98]) for i in range(cmp.MAX_TABLE_ROWS + 50)]
    a = Result("net", {}, records=recs)
    b = Result("net", {}, records=[Record(dict(r.params), nbytes=1, samples_s=list(r.samples_s)) for r in recs])
    b.records[7].samples_s = [2 * t for t in b.records[7].samples_s]  # half the bandwidth, 5 vs 5: slower
    c = cmp.compare(a, b)
    out = cmp.format_table([c], threshold_pct=1, alpha=0.01)
    text = _rich_text(out)
    assert "slower" in text and f"{cmp.MAX_TABLE_ROWS + 49} of {cmp.MAX_TABLE_ROWS + 50} rows not listed" in text
    assert len(cmp.format_markdown([c], threshold_pct=1, alpha=0.01)) > cmp.MAX_TABLE_ROWS  # markdown lists all


def test_batched_judgements_equal_the_one_by_one_ones():
    """judge_many's numpy path (many small figures of equal sizes) gives judge's every figure."""
    rng = np.random.default_rng(9)
    items = []
    for i in range(300):
        m, n = (5, 5) if i % 3 else (4, 9)
        base = np.exp(rng.normal(0, 0.05, m))
        new = np.exp(rng.normal(rng.choice([0, -0.1, 0.2]), 0.05, n))
        if i % 4 == 0:  # ties within and across the sides
            base, new = np.round(base, 1), np.round(new, 1)
        if i % 7 == 0:
            new = base.copy() if m == n else new
        items.append((list(base), list(new), "bandwidth" if i % 2 else "time"))
    many = cmp.judge_many(items, threshold_pct=1.0, alpha=0.01)
    assert len({(len(b), len(n)) for b, n, _ in items}) == 2 and len(items) >= 2 * cmp.BATCH_MIN_FIGURES
    for (b, n, metric), j in zip(items, many):
        one = cmp.judge(b, n, metric, threshold_pct=1.0, alpha=0.01)
        assert j.verdict == one.verdict and j.why == one.why
        assert j.test.p == pytest.approx(one.test.p, rel=1e-12, abs=1e-15) and j.test.method == one.test.method
        assert j.test.u == pytest.approx(one.test.u) and j.test.z == pytest.approx(one.test.z)
        assert j.shift.change_pct == pytest.approx(one.shift.change_pct, abs=1e-9)
        assert (j.shift.ci_low_pct is None) == (one.shift.ci_low_pct is None)
        if one.shift.ci_low_pct is not None:
            assert j.shift.ci_low_pct == pytest.approx(one.shift.ci_low_pct, abs=1e-9)
            assert j.shift.ci_high_pct == pytest.approx(one.shift.ci_high_pct, abs=1e-9)
        assert j.base_median == pytest.approx(one.base_median) and j.new_median == pytest.approx(one.new_median)


def test_judging_in_chunks_gives_the_same_rows(monkeypatch):
    rng = np.random.default_rng(4)
    recs_a = [Record({"i": i}, nbytes=1, samples_s=list(np.exp(rng.normal(0, 0.05, 5)))) for i in range(50)]
    recs_b = [Record({"i": i}, nbytes=1, samples_s=list(np.exp(rng.normal(0.1 * (i % 3), 0.05, 5)))) for i in range(50)]
    a, b = Result("net", {}, records=recs_a), Result("net", {}, records=recs_b)
    def view(c):  # numpy's and math's logarithms may differ in the last bit
        return [(r.params, r.verdict, r.why, round(r.p, 12), round(r.change_pct, 9), round(r.ci_low_pct, 9))
                for r in c.rows]

    whole = view(cmp.compare(a, b))  # one chunk of 50: the numpy batch
    monkeypatch.setattr(cmp, "JUDGE_CHUNK", 7)  # chunks of 7: under BATCH_MIN_FIGURES, one by one
    assert view(cmp.compare(a, b)) == whole and len(whole) == 50


def test_hodges_lehmann_and_moses_interval_by_hand():
    """5 vs 5, new = 0.76 x base: HL exactly -24%; at 99% C = 1 (P(U <= 0) = 1/252 <= 0.005 <
    P(U <= 1) = 2/252), so the interval is [D_(1), D_(25)], the extreme pairwise ratios
    0.76 x 0.99/1.01 and 0.76 x 1.01/0.99; exact p = 2/252. And an overlapping 5 vs 5: HL the 13th of the 25 sorted log-ratios, p = 14/252 by enumerating the 252 splits."""
    import itertools
    import math

    from gpubench.analysis import compare as C

    f = (1.0, 1.01, 0.99, 1.005, 0.995)
    base = [55e9 * x for x in f]
    j = C.judge(base, [0.76 * v for v in base], "bandwidth", threshold_pct=1.0)
    assert j.shift.change_pct == pytest.approx(-24.0, abs=1e-9)
    assert j.shift.ci_low_pct == pytest.approx(100 * (0.76 * 0.99 / 1.01 - 1), abs=1e-9)
    assert j.shift.ci_high_pct == pytest.approx(100 * (0.76 * 1.01 / 0.99 - 1), abs=1e-9)
    assert j.test.p == pytest.approx(2 / 252) and j.verdict == "slower"

    b, n = [55, 40, 60, 45, 50], [38, 42, 36, 47, 34]
    j = C.judge([x * 1e9 for x in b], [x * 1e9 for x in n], "bandwidth", threshold_pct=1.0)
    d = sorted(math.log(y / x) for y in n for x in b)
    assert j.shift.change_pct == pytest.approx(100 * math.expm1(d[12]))
    assert (j.shift.ci_low_pct, j.shift.ci_high_pct) == pytest.approx((100 * math.expm1(d[0]), 100 * math.expm1(d[24])))
    pool = b + n

    def u(xs, ys):
        return sum((a > c) + 0.5 * (a == c) for a in xs for c in ys)

    u0 = u(n, b)
    hits = sum(abs(u([pool[i] for i in s], [pool[i] for i in range(10) if i not in s]) - 12.5) >= abs(u0 - 12.5)
               for s in itertools.combinations(range(10), 5))
    assert j.test.p == pytest.approx(hits / 252) and hits == 14
    assert j.verdict == "inconclusive"


def test_an_incidental_option_of_the_command_is_not_a_difference():
    """net's port (a free one each run of net local) does not change what a figure means; its mode does."""
    from gpubench.analysis.compare import env_diff

    a = Result(command="net", spec={"mode": "local", "port": 0, "cport": None, "streams": 2})
    b = Result(command="net", spec={"mode": "client", "port": 40803, "cport": 6000, "streams": 2})
    assert [d[0] for d in env_diff(a, b) if d[0].startswith("option ")] == ["option mode"]


# ---- the cost of each path: linear (or n log n) in the samples ----

def _u_at_most_by_python_ints(n1, n2, k):
    """Orderings with U <= k by the same Gaussian binomial series in Python integers (the reference)."""
    m, n = min(n1, n2), max(n1, n2)
    c = [1] + [0] * k
    for i in range(1, m + 1):
        for u in range(i, k + 1):
            c[u] += c[u - i]
        before = c[:]
        for u in range(n + i, k + 1):
            c[u] -= before[u - n - i]
    return sum(c)


def _u_cumulative_by_recurrence(n1, n2):
    """Orderings with U <= u for each u, by f(u; m, n) = f(u - n; m - 1, n) + f(u; m, n - 1)
    (Mann and Whitney 1947, eq. 2): the reference table."""
    prev = [[1] for _ in range(n2 + 1)]
    for m in range(1, n1 + 1):
        cur = [[1]]
        for n in range(1, n2 + 1):
            row = [0] * n + prev[n]
            for u, c in enumerate(cur[n - 1]):
                row[u] += c
            cur.append(row)
        prev = cur
    return list(itertools.accumulate(prev[n2]))


def test_the_exact_count_of_u_by_the_truncated_series_equals_the_recurrence_table():
    for n1 in range(1, cmp.EXACT_MAX + 1):
        for n2 in [*range(1, 13), 31, 50, 62]:  # up to 8 x 62, over EXACT_TABLE_MAX_PAIRS
            if n1 * n2 > 500:
                continue
            cum = _u_cumulative_by_recurrence(n1, n2)
            got = [cmp._u_at_most(n1, n2, k) for k in range(n1 * n2 + 1)]
            assert got == list(cum) and got == [cmp._u_at_most(n2, n1, k) for k in range(n1 * n2 + 1)]
            assert all(type(g) is int for g in got)
    # beyond 2^62 orderings (8 vs 1000: 2.6e19) it counts in float64, to 1e-13 of the integers
    for n1, n2, k in [(8, 1000, 37), (8, 1000, 2500), (8, 1000, 4000), (3, 5000, 7500)]:
        assert cmp._u_at_most(n1, n2, k) == pytest.approx(_u_at_most_by_python_ints(n1, n2, k), rel=1e-13)


def test_eight_samples_against_half_a_million_distinct_ones_get_the_exact_p():
    """8 against 500,000 distinct samples (the break-it report: 5,000 took over 200 s, the whole
    null distribution of U built by an O(n1^2 n2^2) recurrence): exact p, in either order."""
    rng = np.random.default_rng(21)
    big = list(1e-3 * (1.0 + rng.permutation(500_000) / 1e7))  # distinct by construction
    ranks = sorted(big)
    # 8 values each just above the (i + 1)-th smallest of the others: U = 1 + 4 + 11 + ..., a tiny p
    small = [(ranks[i] + ranks[i + 1]) / 2 for i in (0, 3, 10, 11, 20, 40, 41, 60)]
    t = cmp.mann_whitney_u(big, small)
    u_small = 500_000 * 8 - t.u  # pairs where a small value is above a big one
    assert t.method == "exact" and u_small == 1 + 4 + 11 + 12 + 21 + 41 + 42 + 61
    want = 2 * _u_at_most_by_python_ints(8, 500_000, int(u_small)) / math.comb(500_008, 8)
    assert t.p == pytest.approx(want, rel=1e-12) and t.p < 1e-30
    assert cmp.mann_whitney_u(small, big).p == t.p
    # through compare, both orders, with 8 values drawn among the others: a row with a verdict
    mid = list(rng.choice(big, 8, replace=False) * (1 + 1e-12))
    a = Result("p2p", {}, records=[Record({"test": "latency"}, metric="time", nbytes=4, samples_s=mid)])
    b = Result("p2p", {}, records=[Record({"test": "latency"}, metric="time", nbytes=4, samples_s=big)])
    for base, new in ((a, b), (b, a)):
        (row,) = cmp.compare(base, new).rows
        assert row.status == "paired" and row.verdict in cmp.VERDICTS and 0 <= row.p <= 1
        assert {row.n_base, row.n_new} == {8, 500_000} and row.ci_low_pct <= row.change_pct <= row.ci_high_pct


def test_one_sample_against_many_tied_ones_takes_the_normal_approximation_not_a_cubic_count():
    """1 against 20,000 samples with ties: C(20,001, 1) splits is under EXACT_TIES_MAX_SPLITS, but the
    exact permutation count would fill 1.6e9 cells (and 6 GB); the normal approximation instead.
    Up to EXACT_TIES_MAX_CELLS it stays exact, and counted on the smaller side."""
    rng = np.random.default_rng(2)
    many = list(np.round(rng.normal(10, 1, 20_000), 1))
    t = cmp.mann_whitney_u([10.0], many)
    assert t.method == "asymptotic" and 0 < t.p <= 1
    few = many[:300]
    t = cmp.mann_whitney_u([10.0], few)
    ranks, _ = cmp._ranks([10.0] + few)
    far = abs(t.u - 300 / 2) - 1e-9
    assert t.method == "exact (ties)"
    assert t.p == pytest.approx(sum(abs(r - 1 - 150) >= far for r in ranks) / 301)  # U of one value = its rank - 1
    assert cmp.mann_whitney_u(few, [10.0]).p == t.p  # the same split counted from the other side


def test_selected_pairwise_differences_equal_sorting_them_when_the_candidates_are_narrowed(monkeypatch):
    monkeypatch.setattr(cmp, "BRUTE_MAX_PAIRS", 0)  # always select
    rng = np.random.default_rng(8)
    for cap in (1, 64, 1 << 20):
        monkeypatch.setattr(cmp, "SELECT_MAX_CANDIDATES", cap)
        for m, n, dec in [(1, 500, None), (37, 410, 1), (300, 300, None), (90, 5, 2), (50, 60, 0)]:
            x, y = rng.normal(0, 1, m), rng.normal(0.3, 1, n)
            if dec is not None:
                x, y = np.round(x, dec), np.round(y, dec)
            d = np.sort(np.subtract.outer(y, x).ravel())
            ks = sorted({1, m * n, (m * n + 1) // 2, m * n // 2 + 1, max(1, m * n // 9)})
            got = cmp._kth_differences(list(x), list(y), ks)
            assert got == pytest.approx([d[k - 1] for k in ks], abs=1e-12), (cap, m, n)
    assert cmp._kth_differences([1.0] * 40, [2.0] * 50, [1, 1000, 2000]) == [1.0, 1.0, 1.0]  # one value
    # two values a side: the differences -1, 0, 1, each repeated far more than the candidates
    # listed (halving towards a tied 0 went on through the subnormals, ~1,000 steps a rank)
    monkeypatch.setattr(cmp, "SELECT_MAX_CANDIDATES", 64)
    x, y = rng.choice([0.0, 1.0], 300), rng.choice([0.0, 1.0], 200)
    d = np.sort(np.subtract.outer(y, x).ravel())
    ks = [1, 20_000, 30_000, 30_001, 45_000, 60_000]
    assert cmp._kth_differences(list(x), list(y), ks) == [d[k - 1] for k in ks]


def test_half_a_million_tied_samples_a_side_get_the_normal_p_and_the_kth_differences_of_the_counts():
    """500,000 against 500,000 samples on a grid of 61 values (heavy ties; 100x the 5,000 of the
    break-it report): U, its tie-corrected normal p and the k-th of the 2.5e11 pairwise
    differences, against references from the value counts alone (no ranking, no selection): the
    differences of grid values i and j are j - i with multiplicity cx[i] cy[j], a convolution of
    the counts; U counts the pairs y > x and half the equal ones."""
    rng = np.random.default_rng(11)
    N, V = 500_000, 61
    x = np.clip(np.round(rng.normal(30, 8, N)), 0, V - 1)
    y = np.clip(np.round(rng.normal(30.4, 8, N)), 0, V - 1)
    cx, cy = np.bincount(x.astype(int), minlength=V), np.bincount(y.astype(int), minlength=V)
    # the Mann-Whitney U of y against x and its normal p (mann_whitney_u's docstring formula)
    below = np.concatenate(([0], np.cumsum(cx)[:-1]))  # x values under each grid value
    u = float((cy * below).sum() + 0.5 * (cy * cx).sum())
    n = 2 * N
    t = cx + cy
    var = N * N / 12.0 * ((n + 1) - float((t.astype(float) ** 3 - t).sum()) / (n * (n - 1)))
    z = (abs(u - N * N / 2.0) - 0.5) / math.sqrt(var)
    got = cmp.mann_whitney_u(list(y), list(x))
    assert got.method == "asymptotic" and got.u == u
    assert got.p == pytest.approx(math.erfc(z / math.sqrt(2.0)), rel=1e-9) and got.p < 1e-3
    # the k-th differences y_j - x_i: d = j - i over -60 .. 60 with multiplicity sum_i cx[i] cy[i + d]
    mult = np.convolve(cy, cx[::-1])  # index d + V - 1
    cum = np.cumsum(mult)
    mn = N * N
    ks = [1, (mn + 1) // 2, mn // 2 + 1, cmp.moses_rank(N, N, 0.01), mn // 3, mn - 7, mn]
    want = [float(np.searchsorted(cum, k) - (V - 1)) for k in ks]
    assert cmp._kth_differences(list(x), list(y), ks) == want


def test_ranks_with_numpy_for_many_values_equal_the_pure_python_ones():
    rng = np.random.default_rng(4)
    v = list(np.round(rng.normal(0, 1, 2_500), 2))
    ranks, groups = cmp._ranks(v)
    order = sorted(range(len(v)), key=v.__getitem__)
    want, sizes, i = [0.0] * len(v), [], 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            want[order[k]] = (i + j) / 2 + 1
        sizes.append(j - i + 1)
        i = j + 1
    assert ranks == want and groups == sizes and all(type(g) is int for g in groups)


# ---- values read from a file: any telemetry shape, huge and tiny samples ----

def _result_file(tmp_path, name, samples, *, metric="bandwidth", nbytes=4096, telemetry=None, flags=None):
    """A one-record copy result (the first record of tests/data/copy-pinned-h200.json) with these
    samples, written as the CLI reads it; ``telemetry`` goes to extra["telemetry"] (not checked by
    the loader beyond finite numbers), ``flags`` to extra["flags"]."""
    import json

    doc = json.loads(synth.REAL_PINNED.read_text())
    rec = doc["records"][0]
    rec.update(samples_s=list(samples), metric=metric, nbytes=nbytes)
    if telemetry is not None:
        rec["extra"]["telemetry"] = telemetry
    if flags is not None:
        rec["extra"]["flags"] = flags
    doc["records"] = [rec]
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def _cli(capsys, *args, debug=True):
    """``gpubench compare ARGS [--debug]`` in this process: (exit code, stdout, stderr); with --debug
    an error that is not gpubench's own (exit 3) prints its traceback."""
    from gpubench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["compare", *args] + (["--debug"] if debug else []))
    out, err = capsys.readouterr()
    return e.value.code, out, err


GOOD_TELEMETRY = _tele(1980, 300, 40, ["sw_power_cap"])
MALFORMED_TELEMETRY = {
    "report": {"sm_clock_mhz": {"min": "a", "median": None}, "reasons": 5},
    "bools": {"reasons": True, "power_w": {"median": False}, "temp_c": True, "other_processes": True},
    "dicts": {"reasons": {"sw_power_cap": 1}, "temp_c": [1, 2], "pcie": {"gen": {"x": 1}, "width": 16}},
    "non-strings": {"reasons": [1, {"a": 2}, [3], None, 2.5, True], "pcie": {"gen": "5", "width": [16]}},
    "huge": {"sm_clock_mhz": {"median": 1.7e308}, "mem_clock_mhz": {"median": -1.7e308},
             "power_w": {"median": 9223372036854775807}, "other_processes": 1.7e308,
             "pcie_replay_delta": -1.7e308, "nvlink_errors_delta": 9223372036854775807},
    "nested": {"sm_clock_mhz": {"median": {"deep": {"er": [1]}}}, "reasons": 2.5, "pcie": [5, 16]},
    "strings": {"reasons": "sw_power_cap", "other_processes": "2", "nvlink_errors_delta": [1], "n": "x"},
    "list": [1, "two", None],
    "number": 7,
    "null": None,
}


@pytest.mark.parametrize("shape", sorted(MALFORMED_TELEMETRY))
def test_a_malformed_telemetry_block_in_a_file_compares_with_exit_0_in_either_order(shape, tmp_path, capsys):
    """Any telemetry block in a file is used or ignored, never raised on (docs/compare.md): against
    a side with a good block, against one with none, in either order, in every format."""
    bad = _result_file(tmp_path, "bad.json", NET_BASE, telemetry=MALFORMED_TELEMETRY[shape])
    good = _result_file(tmp_path, "good.json", NET_BASE, telemetry=GOOD_TELEMETRY)
    plain = _result_file(tmp_path, "plain.json", NET_BASE)
    for a, b in ((good, bad), (bad, good), (plain, bad), (bad, plain)):
        for fmt in ("table", "json"):
            code, out, err = _cli(capsys, a, b, "--format", fmt)
            assert code == 0 and "Traceback" not in err and err == "", (a, b, err)
            if fmt == "json":
                import json

                (row,) = json.loads(out)["comparisons"][0]["rows"]
                for line in row["telemetry"]:  # no text made of a non-string reason or a 309-digit number
                    assert "{" not in line and "[" not in line and "True" not in line and len(line) < 120, line


def test_telemetry_numbers_are_finite_ints_or_floats_and_reasons_strings():
    assert cmp._num({"a": {"median": 10**400}}, "a") is None  # not a float
    assert cmp._num({"a": {"median": float("inf")}}, "a") is None and cmp._num({"a": float("nan")}, "a") is None
    assert cmp._num({"a": True}, "a") is None and cmp._num({"a": "3"}, "a") is None
    assert cmp._num({"a": {"median": 3}}, "a") == 3.0 and cmp._num({"a": 2.5}, "a") == 2.5
    a, b = _net({0: NET_BASE}), _net({0: NET_BASE})
    a.records[0].extra["telemetry"] = _tele(1980, 300, 40, ["sw_power_cap"])
    b.records[0].extra["telemetry"] = {**_tele(1.7e308, 300, 40, [1, "hw_slowdown", {"a": 1}]), "other_processes": 10**400}
    assert cmp.compare(a, b).rows[0].telemetry == ["SM clock 1980->1.7e+308 MHz", "new only: hw_slowdown",
                                                   "base only: sw_power_cap"]
    b.records[0].extra.update(flags=[True, None, 1.5, "x", [1]])
    assert cmp.compare(a, b).rows[0].flags == ["new: 1.5", "new: x"]


@pytest.mark.parametrize("huge,normal,metric,nbytes", [
    ([1e308] * 5, NET_BASE, "bandwidth", 4096),  # 4.1e-305 B/s against ~1e9: a ratio of e^720
    ([1e308] * 4, NET_BASE[:4], "time", 0),  # an even count: the median of two 1e308 is no inf
    ([5e-324] * 5, NET_BASE, "time", 0),  # the smallest float the loader takes (a record moving no bytes)
    ([1.7976931348623157e308] * 6, [1e-6] * 3 + [2e-6] * 3, "time", 0),
])
def test_huge_and_tiny_samples_compare_with_exit_0_and_a_row_in_both_orders(huge, normal, metric, nbytes,
                                                                           tmp_path, capsys):
    import json

    a = _result_file(tmp_path, "a.json", huge, metric=metric, nbytes=nbytes)
    b = _result_file(tmp_path, "b.json", [v * 1e-9 for v in normal], metric=metric, nbytes=nbytes)
    for x, y in ((a, b), (b, a)):
        code, out, err = _cli(capsys, x, y, "--format", "json")
        assert code == 0 and err == "", err

        def no_constant(c):
            raise AssertionError(f"{c} is not JSON")

        (row,) = json.loads(out, parse_constant=no_constant)["comparisons"][0]["rows"]
        separated = 2 / math.comb(len(huge) + len(normal), len(huge))  # 4 vs 4: 0.029, inconclusive at 0.01
        assert row["verdict"] in ("faster", "slower", "inconclusive", "undecidable") and row["p"] == pytest.approx(separated)
        assert math.isfinite(row["base_median"]) and math.isfinite(row["new_median"])
        assert -100 <= row["change_pct"] <= cmp.CHANGE_PCT_MAX
        if row["ci_low_pct"] is not None:  # 4 vs 4 have no 99% interval
            assert -100 <= row["ci_low_pct"] <= row["change_pct"] <= row["ci_high_pct"] <= cmp.CHANGE_PCT_MAX
        for fmt in ("table", "markdown"):
            code, out, err = _cli(capsys, x, y, "--format", fmt)
            assert code == 0 and err == "" and any(v in out for v in ("faster", "slower", "inconclusive", "undecidable"))
            assert "inf" not in out.replace("inconclusive", "") and "nan" not in out
            assert ">+1e+308%" in out.replace("&gt;", ">") or "-100.00%" in out


def test_zero_second_samples_are_refused_with_one_line_in_both_orders(tmp_path, capsys):
    """The loader takes 0.0 s only in a record that moves no bytes; a figure of it has no log ratio:
    compare refuses it (exit 2, one line naming the sample), as docs/compare.md says."""
    a = _result_file(tmp_path, "zero.json", [0.0] * 5, metric="time", nbytes=0)
    b = _result_file(tmp_path, "b.json", [1e-6] * 5, metric="time", nbytes=0)
    for x, y in ((a, b), (b, a)):
        code, out, err = _cli(capsys, x, y, debug=False)
        assert code == 2 and "Traceback" not in err and err.count("\n") == 1 and "0.0 seconds" in err


def test_a_change_beyond_a_float_is_its_ceiling_and_medians_of_huge_values_stay_finite():
    s = cmp.hodges_lehmann([1e-300] * 3, [1e300] * 3)
    assert s.change_pct == cmp.CHANGE_PCT_MAX and cmp._pct_cell(s.change_pct) == ">+1e+308%"
    assert cmp.hodges_lehmann([1e300] * 3, [1e-300] * 3).change_pct == -100.0
    assert cmp._pct_cell(12345678.9) == "+1.23e+07%" and cmp._pct_cell(-5.0) == "-5.00%"
    assert cmp._median([1.7e308, 1.7976931348623157e308]) == pytest.approx(1.75e308, rel=0.01)
    assert cmp._value_cell(1e308, "time", "GB") == "1e+314" and cmp._value_cell(2e-6, "time", "GB") == "2"
    # the numpy batches (>= BATCH_MIN_FIGURES figures of equal sizes) take the same medians
    items = [([1.7e308, 1.6e308, 1.5e308, 1.4e308, 1.3e308, 1.2e308], [1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6], "time")]
    for j in cmp.judge_many(items * cmp.BATCH_MIN_FIGURES, threshold_pct=1.0) + cmp.judge_many(items, threshold_pct=1.0):
        assert j.base_median == pytest.approx(1.45e308) and j.verdict == "faster" and j.shift.change_pct == -100.0
