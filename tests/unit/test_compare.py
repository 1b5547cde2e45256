"""compare: the Mann-Whitney U test, the Hodges-Lehmann change and its interval, verdicts on constructed
samples and samples from known distributions, pairing, env diff, telemetry and flags, escaping."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import synth  # noqa: E402

from gpubench import compare as cmp  # noqa: E402
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
    assert cmp._u_counts(2, 2) == (1, 1, 2, 1, 1)
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
    assert c.counts() == {"faster": 0, "slower": 0, "same": 20, "inconclusive": 0,
                          "only-base": 0, "only-new": 0, "no-data": 0}
    assert c.missing() == []
    assert all(row.change_pct == 0 and row.p == 1.0 for row in c.rows)
    assert c.env_diff == []


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
    assert diff["NCCL"] == ("22803", "22809")
    assert diff["NCCL_* variables"] == ("NCCL_NVLS_ENABLE=0", "NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0")
    b.env = dict(b.env, nccl=dict(a.env["nccl"]))
    assert not [w for w, *_ in cmp.env_diff(a, b) if w.startswith("NCCL")]


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


def test_three_runs_cannot_be_tested_so_a_big_drop_is_inconclusive_not_slower():
    base = _res({1: [1.00, 1.01, 0.99]})
    slow = _res({1: [2.00, 2.02, 1.98]})  # half the bandwidth
    c = cmp.compare(base, slow)
    (row,) = c.rows
    assert row.p == pytest.approx(0.1)  # the least 3 vs 3 can give
    # noise alone moves 3 merge runs by several %: failing on it failed ~40 % of healthy re-runs
    assert row.verdict == "inconclusive" and c.regressions() == [] and c.inconclusive() == [row]
    assert "cannot reach p < 0.01" in row.why
    assert row.ci_low_pct is None  # 3 vs 3 has no 99% interval
    (row,) = cmp.compare(slow, base).rows
    assert row.verdict == "inconclusive"
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
    from gpubench.bench import net

    req = net.Request(streams=1, seconds=0.3, omit=0.0, interval=0.1)
    a, b = net.run_local(req), net.run_local(req)
    assert a.spec["port"] == b.spec["port"] == 0  # asked: any free port
    assert a.timing["server_port"] > 0 and b.timing["server_port"] > 0
    assert not [w for w, *_ in cmp.env_diff(a, b) if w.startswith("option")]


def test_nccl_comparisons_say_the_rates_are_algbw_and_busbw_moves_with_them():
    from gpubench.bench import nccl as N

    spec = N.NcclSpec(sizes=(1 << 20,), places=("out-of-place",))

    def res(t):
        return Result("nccl", spec.to_dict(), records=N.to_records(spec, [N.Point(1 << 20, 1 << 18, "out-of-place",
                                                                                  [t] * 5, 0)], 4))

    c = cmp.compare(res(1e-4), res(1e-4))
    assert any("algbw = S/t" in n and "algbw * 2(n-1)/n" in n for n in c.notes)
    assert not any("algbw" in n for n in cmp.compare(synth.copy_like(1), synth.copy_like(2)).notes)
