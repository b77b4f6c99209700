"""Liveness as the parts that write leases see it (efo.worker.liveness.LeaseTrust), set by hand."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Trusted:
    valid: bool = True  # as if a heartbeat had just landed: its leases are valid
    in_doubt: bool = False
