"""Regression detection: an online step detector run for each new result (with a confirmation
re-run before alerting), an offline change-point pass over per-run medians for gradual drift,
attribution of each regression to what changed between runs, and grouping across chips.

Modules
- :mod:`.base`        run points, findings, the detector interfaces and their registry
- :mod:`.noise`       the noise model (run-to-run and within-run variance of run medians)
- :mod:`.step`        the online step detector
- :mod:`.changepoint` the offline change-point pass (binary segmentation, permutation test)
- :mod:`.segments`    the two-level test (pooled run-to-run sigma with a prior) both detectors use
- :mod:`.attribution` what changed between the last run before a change and the first after; the group key
- :mod:`.series`      loading a series' runs from the database
- :mod:`.engine`      the result hook, confirmation handling and the scan
- :mod:`.triage`      a person's actions: acknowledge, invalid/ignored/fixed, grouping by hand, per-series
                      thresholds, and their history

:mod:`.base`, :mod:`.noise`, :mod:`.segments`, :mod:`.step`, :mod:`.changepoint` and
:mod:`.attribution` need only numpy and scipy (the detector benchmark imports them without a database).
"""
