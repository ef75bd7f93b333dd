"""Regression detection through the real coordinator at the edges of a series (SQLite and, with
KERNELFLEET_TEST_POSTGRES_URL, PostgreSQL): a step at a chip's third run is confirmed and alerted;
one MLX upgrade that slows two chips, in series where every run has its own MLX version, is one
grouped alert naming the exact version pair; a suspect on the newest run stays ``confirming``
(through later runs and a scan) until its confirmation job reports; a slowdown confirmed soon
after an open regression extends it rather than raising a second alert."""

from __future__ import annotations

from typing import Any

import numpy as np
from test_regressions_api import enroll, make_report, regressions, run_leased_job, scan

SHAPE = "4096x4096"


def post_reports(coordinator: Any, reports: list[dict[str, Any]]) -> list[int]:
    """Import ``reports`` one request at a time (each is judged as it arrives, as from a worker);
    returns their result ids."""
    ids: list[int] = []
    for report in reports:
        with coordinator.admin() as admin:
            r = admin.post("/results/import", json={"reports": [report]})
        assert r.status_code == 201, r.text
        ids += r.json()["result_ids"]
        coordinator.settle()
    return ids


def test_step_at_the_third_run_is_confirmed_and_alerted(coordinator: Any) -> None:
    rng = np.random.default_rng(21)
    ids = post_reports(coordinator, [make_report(SHAPE, m, rng=rng) for m in (100.0, 100.6)])
    ids += post_reports(coordinator, [make_report(SHAPE, 118.0, rng=rng, mlx="0.32.4")])  # run 3: +18 %
    [reg] = regressions(coordinator)
    assert reg["status"] == "confirming" and reg["detector"] == "step"
    assert reg["cause"] == {"mlx_version": ["0.32.3", "0.32.4"]}

    worker = enroll(coordinator)
    confirm = run_leased_job(worker, make_report(SHAPE, 117.0, rng=rng, mlx="0.32.4"))
    assert confirm["kind"] == "confirm" and confirm["job_id"] == reg["confirm_job_id"]
    # two or three slower runs of +18 % are what a bad pair (and a spike next to it) looks like:
    # two more re-runs settle it
    [waiting] = regressions(coordinator)
    assert waiting["status"] == "confirming" and waiting["confirm_job_id"] != reg["confirm_job_id"]
    again = run_leased_job(worker, make_report(SHAPE, 117.5, rng=rng, mlx="0.32.4"))
    assert again["kind"] == "confirm" and again["job_id"] == waiting["confirm_job_id"]
    [waiting] = regressions(coordinator)
    assert waiting["status"] == "confirming" and waiting["confirm_job_id"] != again["job_id"]
    last = run_leased_job(worker, make_report(SHAPE, 117.8, rng=rng, mlx="0.32.4"))
    assert last["kind"] == "confirm" and last["job_id"] == waiting["confirm_job_id"]
    [reg] = regressions(coordinator)
    assert reg["status"] == "open" and 0.15 < reg["effect"] < 0.2
    # the alert names the third run and the second as the pair around the change
    assert reg["result_id"] == ids[2] and reg["baseline_result_id"] == ids[1]
    worker.close()


def test_multi_chip_upgrade_is_one_grouped_alert_naming_the_versions(coordinator: Any) -> None:
    rng = np.random.default_rng(22)
    chips = {"Apple M3 Max": 100.0, "Apple M4 Pro": 70.0, "Apple M2 Ultra": 90.0}
    versions = [f"0.{30 + i}.0" for i in range(7)]  # every run its own MLX version
    for i, version in enumerate(versions[:6]):
        post_reports(
            coordinator,
            [
                make_report(SHAPE, base * (1 + 0.004 * np.sin(i + k)), rng=rng, mlx=version, chip=chip)
                for k, (chip, base) in enumerate(chips.items())
            ],
        )
    assert regressions(coordinator) == []
    # MLX 0.36.0 slows the M3 Max and the M4 Pro by 12 %; the M2 Ultra is unaffected
    slowed = {"Apple M3 Max": 1.12, "Apple M4 Pro": 1.12, "Apple M2 Ultra": 1.0}
    post_reports(
        coordinator,
        [
            make_report(SHAPE, base * slowed[chip], rng=rng, mlx=versions[6], chip=chip)
            for chip, base in chips.items()
        ],
    )
    suspects = regressions(coordinator)
    assert sorted(r["chip"] for r in suspects) == ["Apple M3 Max", "Apple M4 Pro"]
    for chip in ("Apple M3 Max", "Apple M4 Pro"):
        worker = enroll(coordinator, chip=chip)
        for level in (1.115, 1.118, 1.116):  # three re-runs: three slower runs may be odd runs
            rerun = make_report(SHAPE, chips[chip] * level, rng=rng, mlx=versions[6], chip=chip)
            confirm = run_leased_job(worker, rerun)
            assert confirm["kind"] == "confirm"
            regressions(coordinator)  # the background loop settles it (and queues the next re-run)
        worker.close()
    alerts = regressions(coordinator, status="open")
    assert len(alerts) == 2
    assert {r["group_key"] for r in alerts} == {"mlx_version=0.35.0->0.36.0"}
    assert all(r["cause"] == {"mlx_version": ["0.35.0", "0.36.0"]} for r in alerts)
    grouped = regressions(coordinator, group="mlx_version=0.35.0->0.36.0")
    assert sorted(r["chip"] for r in grouped) == ["Apple M3 Max", "Apple M4 Pro"]
    # the dashboard shows them as one alert across two chips
    with coordinator.client() as c:
        page = c.get("/regressions", params={"status": "open"}, headers={"accept": "text/html"})
    if page.status_code == 200 and "text/html" in page.headers.get("content-type", ""):
        assert "0.35.0" in page.text and "0.36.0" in page.text


def test_suspect_on_the_newest_run_survives_until_its_confirmation(coordinator: Any) -> None:
    rng = np.random.default_rng(23)
    medians = [50.0 * (1 + 0.004 * np.cos(i)) for i in range(8)]
    post_reports(coordinator, [make_report(SHAPE, m, rng=rng) for m in medians])
    post_reports(coordinator, [make_report(SHAPE, 53.0, rng=rng, mlx="0.32.4")])  # newest run: +6 %
    [reg] = regressions(coordinator)
    assert reg["status"] == "confirming"
    # runs stored while it waits and a scan leave it alone: no second suspect, no scan alert
    post_reports(coordinator, [make_report(SHAPE, 52.8, rng=rng, mlx="0.32.4")])
    assert scan(coordinator)["created"] == []
    [still] = regressions(coordinator)
    assert still["id"] == reg["id"] and still["status"] == "confirming"

    worker = enroll(coordinator)
    # the re-run lands at +4.6 %: with the suspect and the run stored since, three slower runs
    # (as many as odd runs in a row): one more re-run, and the four are one 5 % step
    confirm = run_leased_job(worker, make_report(SHAPE, 52.3, rng=rng, mlx="0.32.4"))
    assert confirm["kind"] == "confirm" and confirm["job_id"] == reg["confirm_job_id"]
    [waiting] = regressions(coordinator)
    assert waiting["status"] == "confirming" and waiting["confirm_job_id"] != reg["confirm_job_id"]
    again = run_leased_job(worker, make_report(SHAPE, 52.7, rng=rng, mlx="0.32.4"))
    assert again["kind"] == "confirm" and again["job_id"] == waiting["confirm_job_id"]
    [done] = regressions(coordinator)
    assert done["id"] == reg["id"] and done["status"] == "open" and 0.04 < done["effect"] < 0.08
    assert done["cause"] == {"mlx_version": ["0.32.3", "0.32.4"]}
    worker.close()


def test_a_slowdown_still_rising_extends_its_open_regression(coordinator: Any) -> None:
    rng = np.random.default_rng(24)
    steady = [make_report(SHAPE, 100.0 * (1 + 0.003 * np.sin(i)), rng=rng) for i in range(6)]
    post_reports(coordinator, [*steady, make_report(SHAPE, 110.0, rng=rng)])
    worker = enroll(coordinator)
    run_leased_job(worker, make_report(SHAPE, 110.5, rng=rng))
    regressions(coordinator)  # two slower runs of +10 %: one more re-run
    run_leased_job(worker, make_report(SHAPE, 110.2, rng=rng))
    regressions(coordinator)  # three: one more
    run_leased_job(worker, make_report(SHAPE, 110.4, rng=rng))
    [first] = regressions(coordinator, status="open")
    # two runs later the series is slower again: once confirmed, that moves the open alert's new
    # level instead of raising a second alert
    post_reports(coordinator, [make_report(SHAPE, 120.0, rng=rng)])
    [suspect] = regressions(coordinator, status="confirming")
    run_leased_job(worker, make_report(SHAPE, 120.5, rng=rng))
    regressions(coordinator)
    run_leased_job(worker, make_report(SHAPE, 120.2, rng=rng))
    regressions(coordinator)
    run_leased_job(worker, make_report(SHAPE, 120.4, rng=rng))
    [still] = regressions(coordinator, status="open")
    assert still["id"] == first["id"] and still["new_median_us"] > first["new_median_us"] * 1.05
    assert still["effect"] > first["effect"] + 0.05
    [merged] = regressions(coordinator, status="dismissed")
    assert merged["id"] == suspect["id"]
    assert f"continues regression {first['id']}" in merged["acknowledged_note"]
    worker.close()
