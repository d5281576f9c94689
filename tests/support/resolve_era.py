"""What the two halves of test_resolve_era.py share: tests/unit/matrix/test_resolve_era.py (its tests that need no
Docker) and tests/docker/matrix/test_resolve_era.py (those that do). Written by scripts/layout-tests."""

from __future__ import annotations

from pathlib import Path

HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
