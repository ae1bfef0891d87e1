"""The shipped run-log samples (Parquet, run-log schema v1), installed as the package ``runroute.data``.

Read them through :mod:`features.samples` (``sample_path``, ``sample_files``); ``README.md`` here
says what each file holds and where it comes from; ``make_samples.py`` regenerates them.
"""
