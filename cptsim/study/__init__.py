"""study/: what is learnt from many runs, and how it is shown.

- ``sweep``: schedules x seeds as runs, prepared, trained and followed; its other stages: ``sweepspec`` (what to
  sweep), ``sweepsubmit`` (as scheduler jobs), ``sweepindex`` (into the database), ``sweepstats`` (the report);
- ``results``: the SQLite database of measured runs (one schema, here);
- ``rangetest``: the precision range test (suggests q_min); ``report``: estimated vs executed vs measured
  (``reportbitops``, ``reporthost``, ``reportmeasure``, ``reportformat``, re-exported by ``report``;
  ``reportfit``: ``report --fit``);
- ``plots``: every figure; ``evidence``: the trainer the planner's pilot and range test are given.

May import everything below it (errors ... run, calibration). Only the CLI imports study.
"""
