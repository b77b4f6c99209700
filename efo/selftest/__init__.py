"""``efo selftest``: the whole path against a real account, with nothing left behind (efo/selftest/run.py)."""
